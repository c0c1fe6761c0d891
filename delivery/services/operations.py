"""What an operator or a tenant asks of deliveries: a test event, a recovery of what failed, one
notification sent again (docs/events.md)."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import transaction

from core.db.wakeups import Channel, notify
from core.errors import NotFound
from core.ids import new_id, utcnow
from core.partition_queries import CLOCK_MARGIN
from core.partitions import is_partitioned
from delivery.models import PARKED, Notification
from delivery.partitions import NOTIFICATION_DAYS
from delivery.services.subscriptions import locked_subscription

PING_TYPE = "ServiceAgentPing"


def subscription_send_test(*, tenant_id: str | None, subscription_id: uuid.UUID | str) -> Notification:
    """A `ServiceAgentPing` event for this subscription alone, delivered by the loop now."""
    with transaction.atomic():
        subscription = locked_subscription(tenant_id, subscription_id)
        now = utcnow()
        event_id, aggregate_id = new_id(), new_id()
        envelope = {
            "id": str(event_id),
            "type": PING_TYPE,
            "tenantId": subscription.tenant_id,
            "aggregateId": str(aggregate_id),
            "timestampMs": int(now.timestamp() * 1000),
            "correlationId": str(event_id),
            "causationId": None,
            "payload": {"subscriptionId": str(subscription.subscription_id), "message": "A test event."},
        }
        notify(Channel.DELIVERY)
        return Notification.objects.create(
            notification_id=new_id(),
            subscription=subscription,
            tenant_id=subscription.tenant_id or "",
            event_id=event_id,
            event_seq=0,
            aggregate_id=aggregate_id,
            event_type=PING_TYPE,
            envelope=envelope,
            event_created_at=now,
            next_attempt_at=now,
            manual=True,
            created_at=now,
            updated_at=now,
        )


def subscription_recover(*, tenant_id: str | None, subscription_id: uuid.UUID | str, since: datetime) -> int:
    """Requeue its FAILED and EXPIRED notifications of events since `since`; returns how many."""
    with transaction.atomic():
        subscription = locked_subscription(tenant_id, subscription_id)
        now = utcnow()
        notify(Channel.DELIVERY)
        rows = Notification.objects.filter(
            subscription=subscription,
            state__in=[Notification.State.FAILED, Notification.State.EXPIRED],
            event_created_at__gte=since,
        )
        if is_partitioned(NOTIFICATION_DAYS.table):
            # A notification's id bears its event's time: only the days since `since` are read.
            rows = rows.filter(notification_id__gte=NOTIFICATION_DAYS.key_at(since - CLOCK_MARGIN))
        return rows.update(
            state=Notification.State.PENDING,
            step=0,
            next_attempt_at=now if subscription.enabled else PARKED,  # due once it is enabled
            manual=True,
            locked_until=None,
            claimed_by=None,
            updated_at=now,
        )


def notification_resend(*, tenant_id: str | None, notification_id: uuid.UUID | str) -> Notification:
    """Send one notification again now, whatever its state (its order rule still applies)."""
    with transaction.atomic():
        rows = Notification.objects.select_for_update().filter(pk=notification_id)
        rows = (
            rows.filter(subscription__tenant__isnull=True)
            if tenant_id is None
            else rows.filter(subscription__tenant_id=tenant_id)
        )
        notification = rows.first()
        if notification is None:
            raise NotFound(f"Delivery {notification_id} not found.")
        now = utcnow()
        notification.state = Notification.State.PENDING
        notification.step = 0
        notification.next_attempt_at = now
        notification.manual = True
        notification.locked_until = None
        notification.claimed_by = None  # a try still out is not recorded (notifications_record)
        notification.updated_at = now
        notification.save()
        notify(Channel.DELIVERY)
    return notification
