"""Events raised while a subscription is disabled are queued for it and wait; enabling it
delivers them, except those older than EVENT_DELIVERY_EXPIRY, which expire (recoverable)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from core.ids import new_id, utcnow
from delivery.models import Notification
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
    assert all(n.next_attempt_at is not None for n in waiting)
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
