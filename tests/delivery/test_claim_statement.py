"""The delivery claim's candidates come from a statement written once per process
(delivery.services.claims._due_rows), not compiled by the ORM on every claim. It must pick exactly the
rows, in exactly the order, of the ORM query it replaces, over every case the claim knows:
leases running and run out, tries not yet due, finished notifications, a disabled
subscription, subscriptions left out for their cap, and later events behind an open earlier one."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from core.db import db_uuid, rows_by_key
from core.ids import utcnow
from delivery.models import DeliveryAttempt, Notification, Subscription
from delivery.selectors import OPEN_STATES, notifications_due_exist
from delivery.services import (
    LEASE,
    SendResult,
    lease_length,
    notifications_claim,
    notifications_record,
    subscription_create,
    subscription_send_test,
)
from delivery.services.claims import _due_rows
from delivery.validation import SubscriptionInput
from outbox.dispatcher import dispatch_batch
from tests.support.factories import make_call
from tests.support.locks import in_another_connection, locks_at_once, row_locked_elsewhere


def orm_due_keys(*, now, excluded, limit):
    earlier_open = Notification.objects.filter(
        subscription_id=OuterRef("subscription_id"),
        aggregate_id=OuterRef("aggregate_id"),
        next_attempt_at__isnull=False,
        event_seq__lt=OuterRef("event_seq"),
    )
    return list(
        Notification.objects.filter(
            Q(locked_until__isnull=True) | Q(locked_until__lte=now),
            next_attempt_at__lte=now,
            subscription__enabled=True,
        )
        .exclude(subscription_id__in=excluded)
        .filter(~Exists(earlier_open))
        .order_by("next_attempt_at", "event_seq")
        .values_list("pk", "subscription_id")[:limit]
    )


def _due_keys(**kwargs):
    return [(db_uuid(pk), db_uuid(sub)) for pk, sub, _ in _due_rows(**kwargs)]


@pytest.fixture
def mixed(world):
    """Three tenants' worth of notifications in every state the claim tells apart."""
    hooks = [
        subscription_create(
            tenant_id=tenant, data=SubscriptionInput(kind="webhook", name=f"hook {n}", url="http://127.0.0.1:9/")
        )[0]
        for n, tenant in enumerate(["acme", "acme", "globex", None])
    ]
    for n in range(12):
        make_call("acme" if n % 3 else "globex", name=f"c{n}", due_in=3600)  # Submitted + Scheduled each
    dispatch_batch()
    Subscription.objects.filter(pk=hooks[1].pk).update(enabled=False)
    now = utcnow()
    rng = random.Random(7)
    for i, notification in enumerate(Notification.objects.all()):
        kind = rng.choice(["due", "due", "leased", "lease over", "later", "done"])
        # Every due time differs (no ties in the claim's order, so a limit cuts at one place).
        due = now - timedelta(seconds=rng.randint(1, 50), milliseconds=i)
        changes = {
            "due": {"next_attempt_at": due},
            "leased": {"next_attempt_at": due, "locked_until": now + timedelta(seconds=30)},
            "lease over": {"next_attempt_at": due, "locked_until": now - timedelta(seconds=1)},
            "later": {"next_attempt_at": now + timedelta(seconds=60, milliseconds=i)},
            "done": {"next_attempt_at": None, "state": Notification.State.SUCCEEDED},
        }[kind]
        Notification.objects.filter(pk=notification.pk).update(**changes)
    # Two events a call: acme's 8 calls × (2 hooks + the operator's), globex's 4 × (1 + 1).
    assert Notification.objects.count() == 8 * 2 * 3 + 4 * 2 * 2
    return hooks, now


@pytest.mark.parametrize("limit", [1, 5, 1000])
@pytest.mark.parametrize("left_out", [[], [0], [2, 3]])
def test_it_picks_the_rows_of_the_orm_query_in_its_order(db, mixed, limit, left_out):
    hooks, now = mixed
    excluded = [hooks[i].pk for i in left_out]
    with transaction.atomic():
        got = _due_keys(now=now, excluded=excluded, limit=limit)
    want = orm_due_keys(now=now, excluded=excluded, limit=limit)
    assert got == want
    if limit == 1000:
        assert want, "the data must leave something due"
        assert {sub for _, sub in want} - {hooks[1].pk} == {sub for _, sub in want}  # the disabled one: never


def test_the_idle_look_answers_as_the_orm_query_does(db, mixed):
    """notifications_due_exist, the delivery loop's look 20 times a second."""
    hooks, now = mixed

    def orm(at):
        return Notification.objects.filter(
            Q(locked_until__isnull=True) | Q(locked_until__lte=at),
            state__in=OPEN_STATES,
            next_attempt_at__lte=at,
            subscription__enabled=True,
        ).exists()

    moments = [now - timedelta(seconds=60), now, now + timedelta(seconds=90)]
    assert [notifications_due_exist(now=at) for at in moments] == [orm(at) for at in moments] == [False, True, True]
    Subscription.objects.update(enabled=False)
    assert notifications_due_exist(now=now) is orm(now) is False


def test_rows_by_key_loads_every_field_or_the_named_ones_and_refuses_a_condition_it_cannot_write(db, world):
    hook = subscription_create(tenant_id="acme", data=SubscriptionInput(kind="webhook", name="h", url="http://x/"))[0]
    [whole] = rows_by_key(Subscription, keys=[hook.pk])
    assert (whole.url, whole.kind, whole.secret, whole.enabled) == (hook.url, hook.kind, hook.secret, True)
    [some] = rows_by_key(Subscription, keys=[hook.pk], fields=["name"], where={"enabled": True})
    assert some.name == "h" and some.get_deferred_fields() >= {"url", "secret"}
    assert rows_by_key(Subscription, keys=[hook.pk], where={"enabled": False}) == []
    for where in ({"enabled": None}, {"created_at__gt": utcnow()}):
        with pytest.raises(ValueError, match="is not an = or <= of a value"):
            rows_by_key(Subscription, keys=[hook.pk], where=where)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_notification_another_claim_holds_is_skipped_and_the_subscription_stays_unlocked(world):
    hook = subscription_create(tenant_id="acme", data=SubscriptionInput(kind="webhook", name="h", url="http://x/"))[0]
    held, free = (subscription_send_test(tenant_id="acme", subscription_id=hook.pk) for _ in range(2))
    with row_locked_elsewhere(Notification, held.pk), transaction.atomic():
        keys = _due_keys(now=utcnow(), excluded=[], limit=10)
        assert keys == [(free.pk, hook.pk)]  # skipped, not waited for

        # The candidate is locked by this transaction; its subscription is not.
        assert not in_another_connection(lambda: locks_at_once(Notification, free.pk))
        assert in_another_connection(lambda: locks_at_once(Subscription, hook.pk))


@pytest.fixture(params=["returning", "no-returning"])
def database(request, monkeypatch):
    """The claim leases and reads its rows in one UPDATE ... RETURNING where the database can
    (SQLite 3.35+, PostgreSQL), else in an UPDATE then a SELECT: both paths run."""
    if request.param == "no-returning":
        from django.db import connection

        monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)


def test_the_claim_leases_the_chosen_rows_and_reads_each_as_stored(db, mixed, database):
    """What a try and its recording read of a claimed notification is its row as stored, with
    its subscription; the chosen rows (only they) are leased, in the claim's order."""
    hooks, now = mixed
    Notification.objects.filter(pk__in=[pk for pk, _ in orm_due_keys(now=now, excluded=[], limit=3)]).update(
        attempts=2, step=1, manual=True
    )
    want = [pk for pk, _ in orm_due_keys(now=now, excluded=[], limit=5)]
    before = {n.pk: (n.locked_until, n.next_attempt_at) for n in Notification.objects.all()}

    claimed = notifications_claim(limit=5, now=now, claimed_by="worker-1")

    assert [n.pk for n in claimed] == want
    for item in claimed:
        row = Notification.objects.get(pk=item.pk)
        assert (item.envelope, item.attempts, item.step, item.manual, item.event_created_at) == (
            row.envelope,
            row.attempts,
            row.step,
            row.manual,
            row.event_created_at,
        )
        assert item.subscription == row.subscription and item.subscription.url == row.subscription.url
        assert item.subscription_id == row.subscription_id
        assert row.locked_until == row.next_attempt_at == item.lease_until == now + lease_length()
        assert row.claimed_by == item.claimed_by == "worker-1"
    assert sum(item.manual for item in claimed) == 3
    untouched = {n.pk: (n.locked_until, n.next_attempt_at) for n in Notification.objects.exclude(pk__in=want)}
    assert untouched == {pk: times for pk, times in before.items() if pk not in want}


def test_recording_moves_each_try_on_and_logs_it(db, mixed, database):
    """Successes in one statement per attempt count, failures each on their own: states,
    counts, the attempt log and the subscriptions' streaks as each try says."""
    hooks, now = mixed
    Notification.objects.filter(pk__in=[pk for pk, _ in orm_due_keys(now=now, excluded=[], limit=2)]).update(
        attempts=3, manual=True
    )
    claimed = notifications_claim(limit=6, now=now)
    assert len(claimed) == 6
    # Every try of one subscription fails (its streak starts), every other one succeeds.
    failed_subscription = claimed[5].subscription_id
    Subscription.objects.filter(pk=failed_subscription).update(last_success_at=None)
    at = utcnow()
    results = [
        (n, SendResult(succeeded=False, started_at=at, status_code=500, error="HTTP 500"))
        if n.subscription_id == failed_subscription
        else (n, SendResult(succeeded=True, started_at=at, latency_ms=4, status_code=204))
        for n in claimed
    ]
    succeeded = [n for n, r in results if r.succeeded]
    assert succeeded, "the claim must hold tries of more than one subscription"

    notifications_record(results=results)

    rows = {n.pk: n for n in Notification.objects.filter(pk__in=[n.pk for n in claimed])}
    for item in succeeded:
        row = rows[item.pk]
        assert (row.state, row.attempts, row.manual, row.locked_until, row.next_attempt_at, row.last_error) == (
            Notification.State.SUCCEEDED,
            item.attempts + 1,
            False,
            None,
            None,
            "",
        )
        assert row.delivered_at is not None and row.delivered_at >= at
    for item in claimed:
        if item.subscription_id != failed_subscription:
            continue
        failed = rows[item.pk]
        assert (failed.state, failed.attempts, failed.step, failed.last_error) == (
            Notification.State.FAILED,
            item.attempts + 1,
            1,
            "HTTP 500",
        )
        assert failed.next_attempt_at > at and failed.delivered_at is None
    logged = {
        (a.notification_id, a.n, a.trigger, a.status_code, a.latency_ms, a.error)
        for a in DeliveryAttempt.objects.filter(notification_id__in=rows)
    }
    assert logged == {
        (n.pk, n.attempts + 1, "manual" if n.manual else "scheduled", r.status_code, r.latency_ms, r.error)
        for n, r in results
    }
    assert sum(1 for n, _ in results if n.manual) == 2
    for subscription in Subscription.objects.filter(pk__in={n.subscription_id for n in succeeded}):
        assert subscription.last_success_at is not None and subscription.failing_since is None
    failing = Subscription.objects.get(pk=failed_subscription)
    assert failing.failing_since is not None and failing.last_success_at is None


def test_the_lease_outlasts_a_wait_behind_the_tries_ahead_and_a_try_of_its_own(db, mixed, settings):
    """Claimed ahead, a try may wait for DELIVERY_CLAIM_AHEAD - 1 tries of its subscription,
    then last its timeout: the lease covers them with one more try's room, whatever the
    timeouts and the depth are."""
    hooks, now = mixed
    settings.DELIVERY_CLAIM_AHEAD = 4
    settings.WEBHOOK_TIMEOUT_MS, settings.NATS_PUBLISH_TIMEOUT_MS = 10_000, 5_000
    assert lease_length() == LEASE  # 5 × 10 s is less than the least lease
    settings.WEBHOOK_TIMEOUT_MS = 15_000  # the default
    assert lease_length() == timedelta(seconds=75)
    settings.WEBHOOK_TIMEOUT_MS, settings.NATS_PUBLISH_TIMEOUT_MS = 1_000, 40_000
    assert lease_length() == timedelta(seconds=400)
    [claimed] = notifications_claim(limit=1, now=now)
    row = Notification.objects.get(pk=claimed.pk)
    assert row.locked_until == row.next_attempt_at == now + timedelta(seconds=400)
    settings.DELIVERY_CLAIM_AHEAD, settings.WEBHOOK_TIMEOUT_MS, settings.NATS_PUBLISH_TIMEOUT_MS = 2, 15_000, 5_000
    assert lease_length() == LEASE  # PostgreSQL's default: 3 × 15 s is less than the least lease
    settings.DELIVERY_CLAIM_AHEAD, settings.WEBHOOK_TIMEOUT_MS = 16, 120_000  # the largest allowed
    assert lease_length() == timedelta(seconds=17 * 120)
