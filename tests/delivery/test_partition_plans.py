"""Notifications and their tries partitioned by day (PostgreSQL): the queries as the code builds
them read only the partitions they need (docs/schema.md, "History partitioned by day"). The
delivery loop's look and claim, and the watchdog's release, only the window of the open
notifications; a call's deliveries from the day the call was made; a subscription's page of
deliveries from its cursor back to the day the subscription was made; a delivery's tries, its
own day. Each plan is PostgreSQL's for the statement the code ran."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from core.ids import utcnow
from delivery.models import Notification, Subscription
from delivery.partitions import ATTEMPT_DAYS, NOTIFICATION_DAYS
from delivery.selectors import deliveries_for_call, notification_get, notifications_due_exist
from delivery.services import notifications_claim, notifications_release_dead_claims
from tests.support.api import ApiClient
from tests.support.factories import make_event
from tests.support.partitions import (
    at_days_ago,
    bulk_delivered,
    dated,
    day_names,
    days_made,
    explain,
    forget_windows,
    partitions_read,
    reads,
    statements,
)
from tests.support.subscriptions import fan_out, make_subscription, record_try, subscription_url

pytestmark = pytest.mark.postgres

OLD = [5, 4, 3, 2, 1]


def _reads(run, spec=NOTIFICATION_DAYS) -> list[list[str]]:
    return reads(run, spec)


@pytest.fixture
def subscription(world) -> Subscription:
    """acme's subscription, made six days ago (it receives the events made since)."""
    made, _ = make_subscription()
    Subscription.objects.filter(pk=made.pk).update(created_at=at_days_ago(6))
    days_made(OLD)
    return Subscription.objects.get(pk=made.pk)


def _notification(days_ago: int, call=None) -> Notification:
    """The subscription's notification of an event made `days_ago` (of `call`, or of its own)."""
    event = make_event(made_at=at_days_ago(days_ago), **({"aggregate_id": call} if call else {}))
    [made] = [n for n in fan_out(event.aggregate_id) if n.event_id == event.event_id]
    forget_windows()
    return made


def test_the_delivery_loops_look_and_claim_read_only_the_window_of_the_open_notifications(subscription):
    """From the oldest open notification's day (here two days ago) to tomorrow; the claim's look
    for an earlier open notification of the same call too. In each day with rows, through the
    partial indexes of the open notifications, never along the key: the window takes in whole
    days, so its bound on the key selects nothing within them."""
    delivered = _notification(4)
    record_try(delivered, succeeded=True, status_code=200)
    for days_ago in (2, 1, 0):
        bulk_delivered(days_ago, 2000, subscription)
    _notification(2)
    _notification(0)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE event_notifications")
    window = day_names(NOTIFICATION_DAYS, [2, 1, 0, -1])
    claim = statements(lambda: notifications_claim(limit=10))

    [due] = [(sql, params) for sql, params in claim if "NOT EXISTS" in sql]
    [lease] = [(sql, params) for sql, params in claim if sql.startswith('UPDATE "event_notifications"')]

    read = _reads(notifications_due_exist) + [
        partitions_read(explain(*each), NOTIFICATION_DAYS) for each in (due, lease)
    ]

    assert all(each and set(each) <= set(window) for each in read), read
    assert day_names(NOTIFICATION_DAYS, [2])[0] in read[1]
    plan = explain(*due)
    busy = day_names(NOTIFICATION_DAYS, [2, 1, 0])
    scans = [line for line in plan.splitlines() if any(f" on {name} " in line for name in busy)]
    assert scans and not any("Seq Scan" in line or "_pkey" in line for line in scans), plan


def test_the_watchdogs_release_reads_only_the_window(subscription):
    _notification(1)
    notifications_claim(limit=10, claimed_by="dead")
    window = day_names(NOTIFICATION_DAYS, [1, 0, -1])

    reads = _reads(lambda: notifications_release_dead_claims(live_sessions={"alive"}, looked_at=utcnow()))

    assert reads and all(read and set(read) <= set(window) for read in reads), reads


def test_a_calls_deliveries_are_read_from_the_day_the_call_was_made(subscription):
    call = dated(NOTIFICATION_DAYS, at_days_ago(3))
    _notification(3, call)
    _notification(1, call)

    [read] = _reads(lambda: deliveries_for_call(tenant_id="acme", service_call_id=call))

    assert read == [*day_names(NOTIFICATION_DAYS, [3, 2, 1, 0, -1, -2]), NOTIFICATION_DAYS.default_name]
    assert sum(map(len, deliveries_for_call(tenant_id="acme", service_call_id=call).values())) == 2


def test_a_page_of_deliveries_reads_from_its_cursor_back_to_the_day_the_subscription_was_made(world, subscription):
    """The API's page, newest first by id: a cursor leaves out the newer days, the
    subscription's day the older ones."""
    Subscription.objects.filter(pk=subscription.pk).update(created_at=at_days_ago(4))
    rows = [_notification(days_ago) for days_ago in (4, 3, 2, 1, 0)]
    api = ApiClient(world.acme_key)
    url = subscription_url(subscription.pk, suffix="/deliveries")
    first = api.get(url, {"limit": 2}).json()
    assert [d["notificationId"] for d in first["results"]] == [str(rows[4].pk), str(rows[3].pk)]

    [page] = [
        read for read in _reads(lambda: api.get(first["next"]), NOTIFICATION_DAYS) if read
    ]  # the page (its tries are another table's)

    assert sorted(page) == day_names(NOTIFICATION_DAYS, [4, 3, 2, 1])


def test_a_deliverys_tries_are_read_from_its_own_day(subscription):
    notification = _notification(3)
    record_try(notification, succeeded=False, status_code=500)

    notification_reads = _reads(lambda: notification_get(tenant_id="acme", notification_id=notification.pk))
    attempt_reads = _reads(lambda: notification_get(tenant_id="acme", notification_id=notification.pk), ATTEMPT_DAYS)

    assert notification_reads == [day_names(NOTIFICATION_DAYS, [3])]
    assert attempt_reads == [day_names(ATTEMPT_DAYS, [3])]
    assert len(notification_get(tenant_id="acme", notification_id=notification.pk).delivery_attempts.all()) == 1


def test_an_old_pending_notification_widens_the_window_within_a_second(subscription):
    """A notification opened below the window (an operator's resend of an old one) is found
    once the window is looked for again (each process does at most every second)."""
    old = _notification(5)
    record_try(old, succeeded=True, status_code=200)
    _notification(0)
    assert notifications_due_exist()
    [look] = _reads(notifications_due_exist)
    assert day_names(NOTIFICATION_DAYS, [5])[0] not in look

    Notification.objects.filter(pk=old.pk).update(
        state=Notification.State.PENDING, next_attempt_at=utcnow() - timedelta(seconds=1)
    )
    forget_windows()  # as a second later
    claimed = notifications_claim(limit=10)

    assert old.pk in {notification.pk for notification in claimed}
