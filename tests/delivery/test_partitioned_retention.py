"""Retention of notifications partitioned by day (PostgreSQL): a day wholly past retention whose
notifications are all final goes whole with its tries, at once however many they are; a pending
notification in an old day is never lost (its day stays, the final ones there go row by row);
a disabled subscription's waiting ones keep no day; the day's files are freed while no query of
the history waits, and a day a run left detached goes at the next (docs/schema.md, "History
partitioned by day")."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

from core.ids import utcnow
from delivery.models import DeliveryAttempt, Notification, Subscription
from delivery.partitions import ATTEMPT_DAYS, NOTIFICATION_DAYS
from delivery.services import notifications_delete_before
from tests.support.factories import make_event
from tests.support.partitions import at_days_ago, bulk_delivered, day_ago, days_made, names
from tests.support.subscriptions import fan_out, make_subscription

pytestmark = pytest.mark.postgres

# Enough rows that a DELETE through them would take seconds; a drop takes milliseconds.
MANY = 50_000


def _cutoff():
    return utcnow() - timedelta(days=30)


def _subscription() -> Subscription:
    """A subscription made before the old events these tests date (it receives events made
    since it was)."""
    subscription, _ = make_subscription()
    Subscription.objects.filter(pk=subscription.pk).update(created_at=utcnow() - timedelta(days=60))
    return Subscription.objects.get(pk=subscription.pk)


def _notifications(days_ago: int, count: int, *, state: str) -> list[Notification]:
    """`count` notifications (one per event, to each subscription) of events made `days_ago`,
    as the fan-out makes them, in `state`, each with one try."""
    made = []
    for _ in range(count):
        event = make_event(made_at=at_days_ago(days_ago), event_type="ServiceCallSubmitted")
        made += fan_out(event.aggregate_id)
    assert len(made) == count
    final = state in (Notification.State.SUCCEEDED, Notification.State.EXPIRED)
    keys = [notification.pk for notification in made]
    Notification.objects.filter(pk__in=keys).update(
        state=state,
        next_attempt_at=None if final else utcnow(),
        created_at=at_days_ago(days_ago),
    )
    for key in keys:
        DeliveryAttempt.objects.create(notification_id=key, n=1, trigger="scheduled", started_at=utcnow())
    return made


def test_a_day_of_final_notifications_goes_whole_with_its_tries_at_once(world):
    subscription = _subscription()
    days_made([40, 20])
    bulk_delivered(40, MANY, subscription)
    young = _notifications(20, 1, state="SUCCEEDED")

    started = time.monotonic()
    deleted = notifications_delete_before(before=_cutoff())
    elapsed = time.monotonic() - started

    assert NOTIFICATION_DAYS.partition_name(day_ago(40)) not in names(NOTIFICATION_DAYS)
    assert ATTEMPT_DAYS.partition_name(day_ago(40)) not in names(ATTEMPT_DAYS)
    assert list(Notification.objects.values_list("pk", flat=True)) == [young[0].pk]
    assert DeliveryAttempt.objects.count() == 1
    assert deleted == MANY  # PostgreSQL's estimate of the rows, exact after the ANALYZE
    assert elapsed < 1.0, elapsed


def test_a_pending_notification_in_an_old_day_survives_retention(world):
    _subscription()
    days_made([40])
    pending = _notifications(40, 1, state="PENDING")
    failed = _notifications(40, 1, state="FAILED")
    delivered = _notifications(40, 3, state="SUCCEEDED")

    assert notifications_delete_before(before=_cutoff(), batch_size=2) == 3

    assert NOTIFICATION_DAYS.partition_name(day_ago(40)) in names(NOTIFICATION_DAYS)
    kept = {notification.pk for notification in pending + failed}
    assert set(Notification.objects.values_list("pk", flat=True)) == kept
    assert set(DeliveryAttempt.objects.values_list("notification_id", flat=True)) == kept
    assert not DeliveryAttempt.objects.filter(notification_id__in=[n.pk for n in delivered]).exists()

    # Once they are final, the day goes whole at the next run.
    Notification.objects.filter(pk__in=kept).update(state="EXPIRED", next_attempt_at=None)
    assert notifications_delete_before(before=_cutoff()) >= 0
    assert NOTIFICATION_DAYS.partition_name(day_ago(40)) not in names(NOTIFICATION_DAYS)
    assert not Notification.objects.exists() and not DeliveryAttempt.objects.exists()


def test_a_disabled_subscriptions_waiting_notifications_keep_no_day(world):
    subscription = _subscription()
    days_made([40])
    _notifications(40, 2, state="PENDING")
    Subscription.objects.filter(pk=subscription.pk).update(enabled=False)

    notifications_delete_before(before=_cutoff())

    assert NOTIFICATION_DAYS.partition_name(day_ago(40)) not in names(NOTIFICATION_DAYS)
    assert not Notification.objects.exists()


def _detached() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class WHERE relname ~ '^(event_notifications|event_delivery_attempts)_.*_detached$' "
            "ORDER BY 1"
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_a_days_files_are_freed_while_no_query_of_the_history_or_the_subscriptions_waits(world):
    """The drop of a detached day holds only that day's own table: its foreign keys went first,
    so not even the subscriptions it referred to are locked while its files are freed."""
    subscription = _subscription()
    days_made([40])
    bulk_delivered(40, 1000, subscription)
    dropping, release = threading.Event(), threading.Event()
    locked: list[str] = []
    failures: list[BaseException] = []

    def pause_at_the_drop(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith("DROP TABLE") and "event_notifications" in sql:
            dropping.set()
            release.wait(20)
        return result

    def retention() -> None:
        try:
            with connection.execute_wrapper(pause_at_the_drop):
                notifications_delete_before(before=_cutoff())
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)
        finally:
            connection.close()

    worker = threading.Thread(target=retention)
    worker.start()
    try:
        assert dropping.wait(20), failures
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT DISTINCT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE l.pid <> pg_backend_pid() AND l.granted AND c.relnamespace = current_schema()::regnamespace"
            )
            locked = sorted(row[0] for row in cursor.fetchall())
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '200ms'")
            assert Notification.objects.count() == 0
            assert DeliveryAttempt.objects.count() == 0
            assert Subscription.objects.filter(pk=subscription.pk).exists()
    finally:
        release.set()
        worker.join(20)
    assert not failures, failures
    day = NOTIFICATION_DAYS.partition_name(day_ago(40))
    # The detached table and its own indexes (still named after the partition), nothing else.
    assert f"{day}_detached" in locked and all(name.startswith(day) for name in locked), locked
    assert _detached() == []


def test_a_day_a_run_left_detached_goes_at_the_next_run(world, monkeypatch):
    """A retention run that ends between the detach and the drop (the process killed) leaves the
    day's tables detached and renamed; the next run drops them."""
    subscription = _subscription()
    days_made([40])
    bulk_delivered(40, 100, subscription)
    with monkeypatch.context() as patched:
        patched.setattr("core.partitions.drop_detached", lambda spec, **kwargs: [])
        patched.setattr("delivery.services.retention.drop_detached", lambda spec, **kwargs: [])
        notifications_delete_before(before=_cutoff())
    day = day_ago(40)
    assert _detached() == sorted(
        [f"{ATTEMPT_DAYS.partition_name(day)}_detached", f"{NOTIFICATION_DAYS.partition_name(day)}_detached"]
    )
    assert not Notification.objects.exists() and not DeliveryAttempt.objects.exists()

    notifications_delete_before(before=_cutoff())
    assert _detached() == []
