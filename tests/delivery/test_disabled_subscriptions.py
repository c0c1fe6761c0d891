"""Events raised while a subscription is disabled are queued for it and wait, PARKED out of the
claims' way; enabling it delivers them, except those older than EVENT_DELIVERY_EXPIRY, which
expire (recoverable)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from core.ids import new_id, utcnow
from delivery.models import PARKED, Notification
from delivery.selectors import notifications_due_exist
from delivery.services import (
    EXPIRED_WHILE_DISABLED,
    FanoutEvent,
    notifications_claim,
    notifications_fan_out,
    subscription_recover,
    subscription_update,
)
from delivery.validation import SubscriptionInput
from tests.support.subscriptions import make_subscription


def _event(*, aggregate_id: uuid.UUID, seq: int, tenant_id: str = "acme") -> FanoutEvent:
    envelope = {
        "id": str(new_id()),
        "type": "ServiceCallSubmitted",
        "tenantId": tenant_id,
        "aggregateId": str(aggregate_id),
    }
    return FanoutEvent(envelope=envelope, seq=seq, created_at=utcnow())


def _set_enabled(subscription, enabled: bool) -> None:
    subscription_update(
        tenant_id=subscription.tenant_id,
        subscription_id=subscription.pk,
        data=SubscriptionInput(enabled=enabled),
    )


def test_events_raised_while_disabled_are_queued_and_wait_until_it_is_enabled(world):
    subscription, _ = make_subscription(enabled=False)
    call = new_id()

    assert notifications_fan_out(events=[_event(aggregate_id=call, seq=1), _event(aggregate_id=call, seq=2)]) == 2

    waiting = Notification.objects.filter(subscription=subscription)
    assert [n.state for n in waiting] == ["PENDING", "PENDING"]
    assert all(n.next_attempt_at == PARKED and n.next_try_at is None for n in waiting)
    assert notifications_claim(limit=10) == []  # nothing is sent to a disabled subscription

    _set_enabled(subscription, True)
    [claimed] = notifications_claim(limit=10)  # the head of the call's queue, in order
    assert claimed.subscription_id == subscription.pk
    assert Notification.objects.get(pk=claimed.pk).event_seq == 1


def test_enabling_expires_what_waited_longer_than_the_expiry_and_recover_brings_it_back(world, settings):
    settings.EVENT_DELIVERY_EXPIRY = 3 * 86_400.0  # seconds
    subscription, _ = make_subscription()
    _set_enabled(subscription, False)
    notifications_fan_out(events=[_event(aggregate_id=new_id(), seq=n) for n in (1, 2)])
    old, fresh = Notification.objects.filter(subscription=subscription).order_by("event_seq")
    Notification.objects.filter(pk=old.pk).update(event_created_at=utcnow() - timedelta(days=4))

    _set_enabled(subscription, True)

    old.refresh_from_db()
    fresh.refresh_from_db()
    assert old.state == Notification.State.EXPIRED and old.next_attempt_at is None
    assert old.last_error == EXPIRED_WHILE_DISABLED
    assert fresh.state == Notification.State.PENDING and fresh.next_attempt_at is not None
    assert [n.pk for n in notifications_claim(limit=10)] == [fresh.pk]

    recovered = subscription_recover(
        tenant_id="acme", subscription_id=subscription.pk, since=utcnow() - timedelta(days=5)
    )
    assert recovered == 1
    old.refresh_from_db()
    assert old.state == Notification.State.PENDING and old.next_attempt_at is not None


def test_an_update_that_does_not_enable_expires_nothing(world):
    subscription, _ = make_subscription(enabled=False)
    notifications_fan_out(events=[_event(aggregate_id=new_id(), seq=1)])
    Notification.objects.update(event_created_at=utcnow() - timedelta(days=30))

    subscription_update(tenant_id="acme", subscription_id=subscription.pk, data=SubscriptionInput(name="renamed"))

    assert Notification.objects.get().state == Notification.State.PENDING


def test_disabling_parks_what_waits_and_the_claims_walk_none_of_it(world):
    """A subscription left disabled collects a notification for each event it matches; the
    claims and the delivery loops' looks walk the due index, which they must not find there
    (a bench run's claims took 50-90 ms each behind 23,500 of them)."""
    subscription, _ = make_subscription()
    other, _ = make_subscription(name="other")
    call = new_id()
    notifications_fan_out(events=[_event(aggregate_id=call, seq=n) for n in (1, 2, 3)])
    claimed = Notification.objects.get(subscription=subscription, event_seq=1)
    Notification.objects.filter(pk=claimed.pk).update(locked_until=utcnow() + timedelta(minutes=1), claimed_by="s")

    _set_enabled(subscription, False)

    rows = {n.event_seq: n for n in Notification.objects.filter(subscription=subscription)}
    assert rows[1].next_attempt_at != PARKED  # out on a try: its result comes back to its loop
    assert rows[2].next_attempt_at == PARKED and rows[3].next_attempt_at == PARKED
    assert not Notification.objects.filter(subscription=other, next_attempt_at=PARKED).exists()
    # The looks of the loops read the due index: past today, nothing of the parked ones.
    due = Notification.objects.filter(next_attempt_at__lte=utcnow() + timedelta(days=365 * 100))
    assert set(due.values_list("subscription_id", flat=True)) <= {other.pk, subscription.pk}
    assert not due.filter(subscription=subscription, event_seq__in=[2, 3]).exists()
    assert notifications_due_exist(now=utcnow())  # the other subscription's

    # Enabled again: due now, in order behind the one out on a try.
    Notification.objects.filter(pk=claimed.pk).update(locked_until=None, claimed_by=None, next_attempt_at=utcnow())
    _set_enabled(subscription, True)
    assert not Notification.objects.filter(next_attempt_at=PARKED).exists()
    mine = [n for n in notifications_claim(limit=10) if n.subscription_id == subscription.pk]
    assert [Notification.objects.get(pk=n.pk).event_seq for n in mine] == [1]


def test_a_subscription_the_receiver_disables_parks_its_waiting_notifications(world):
    from delivery.services.record import _subscription_note
    from delivery.tries import SendResult

    subscription, _ = make_subscription()
    notifications_fan_out(events=[_event(aggregate_id=new_id(), seq=1)])
    gone = SendResult(succeeded=False, started_at=utcnow(), status_code=410, error="410 Gone", gone=True)
    _subscription_note(subscription.pk, [gone], utcnow())
    subscription.refresh_from_db()
    assert not subscription.enabled
    assert Notification.objects.get(subscription=subscription).next_attempt_at == PARKED


def test_recovering_for_a_disabled_subscription_parks_what_it_requeues(world):
    subscription, _ = make_subscription()
    notifications_fan_out(events=[_event(aggregate_id=new_id(), seq=1)])
    Notification.objects.update(state=Notification.State.EXPIRED, next_attempt_at=None)
    _set_enabled(subscription, False)
    assert subscription_recover(tenant_id="acme", subscription_id=subscription.pk, since=utcnow() - timedelta(days=1))
    assert Notification.objects.get().next_attempt_at == PARKED
    _set_enabled(subscription, True)
    assert Notification.objects.get().next_attempt_at <= utcnow()
