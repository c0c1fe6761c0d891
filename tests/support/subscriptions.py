"""Subscriptions and their deliveries from a test, made through the delivery module's own
validation and services (tests/support/factories.py holds the other domain objects)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.ids import utcnow
from delivery.fanout import NotificationSink
from delivery.models import Notification, Subscription
from delivery.services import SendResult, notifications_record, subscription_create
from delivery.validation import validate_subscription
from outbox.models import OutboxEvent

# Nothing listens on port 9 (discard), and nothing in these tests runs the delivery loop.
NEVER_CALLED_HOOK = "http://127.0.0.1:9/hook"


def subscriptions_url(tenant: str = "acme", suffix: str = "") -> str:
    return f"/api/tenants/{tenant}/subscriptions{suffix}"


def subscription_url(subscription_id: Any, tenant: str = "acme", suffix: str = "") -> str:
    return f"{subscriptions_url(tenant)}/{subscription_id}{suffix}"


def resend_url(notification_id: Any, tenant: str = "acme") -> str:
    return f"/api/tenants/{tenant}/deliveries/{notification_id}/resend"


def make_subscription(
    tenant_id: str | None = "acme",
    *,
    name: str = "hook",
    url: str = NEVER_CALLED_HOOK,
    event_types: Iterable[str] | None = None,
    enabled: bool | None = None,
) -> tuple[Subscription, str]:
    """A webhook subscription (tenant_id None: operator-wide), checked as every edge checks one;
    returns it with its signing secret."""
    data: dict[str, Any] = {"kind": "webhook", "name": name, "url": url}
    if event_types is not None:
        data["eventTypes"] = list(event_types)
    if enabled is not None:
        data["enabled"] = enabled
    subscription, secret = subscription_create(
        tenant_id=tenant_id, data=validate_subscription(data, operator=tenant_id is None)
    )
    assert secret is not None
    return subscription, secret


def fan_out(aggregate_id: Any) -> list[Notification]:
    """Fan a call's events out to the subscriptions matching them, as the outbox dispatcher's
    sink does; returns the call's notifications in event order."""
    NotificationSink().publish_events(list(OutboxEvent.objects.filter(aggregate_id=aggregate_id).order_by("id")))
    return list(Notification.objects.filter(aggregate_id=aggregate_id).order_by("event_seq", "created_at"))


def record_try(
    notification: Notification,
    *,
    succeeded: bool,
    status_code: int | None = None,
    error: str = "",
    response_snippet: str = "",
) -> Notification:
    """One try of a notification recorded as the delivery loop records it; re-read."""
    notification = Notification.objects.get(pk=notification.pk)
    result = SendResult(
        succeeded=succeeded,
        started_at=utcnow(),
        latency_ms=7,
        status_code=status_code,
        response_snippet=response_snippet,
        error=error,
    )
    notifications_record(results=[(notification, result)])
    return Notification.objects.get(pk=notification.pk)
