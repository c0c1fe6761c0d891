"""The wire representation of subscriptions and their deliveries: one builder for the API and
the commands (`list_subscriptions --json`). camelCase keys, times as ISO 8601 UTC with
milliseconds and Z (docs/api.md, "Wire format"). A signing secret is never part of it: the API
adds it to the one answer that shows it (create, rotate)."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from core.ids import iso_ms
from delivery.models import DeliveryAttempt, Notification, Subscription
from delivery.selectors import LAG_WINDOW, SubscriptionFigures


def _url(request: Any, path: str) -> str:
    return request.build_absolute_uri(path) if request is not None else path


def subscription_links(subscription: Subscription, *, request: Any = None) -> dict[str, str]:
    """The URLs of a tenant's subscription and its operations (none for an operator-wide one:
    the tenant API does not show those)."""
    if subscription.tenant_id is None:
        return {}
    own = _url(
        request,
        reverse(
            "api:subscription-detail",
            kwargs={"tenant_id": subscription.tenant_id, "subscription_id": str(subscription.subscription_id)},
        ),
    )
    # Its operations are fixed suffixes of its path (eventservice/api/urls.py).
    return {
        "self": own,
        "deliveries": f"{own}/deliveries",
        "rotateSecret": f"{own}/rotate-secret",
        "test": f"{own}/test",
        "recover": f"{own}/recover",
    }


def figures_representation(figures: SubscriptionFigures | None) -> dict[str, Any]:
    figures = figures or SubscriptionFigures()
    return {
        "pending": figures.pending,
        "lagP50Ms": figures.lag_p50_ms,
        "lagP99Ms": figures.lag_p99_ms,
        "lagSample": figures.lag_sample,
        "lagWindowMinutes": int(LAG_WINDOW.total_seconds() // 60),
    }


def subscription_representation(
    subscription: Subscription, *, figures: SubscriptionFigures | None = None, request: Any = None
) -> dict[str, Any]:
    """A subscription with its health and figures (selectors.subscription_figures; none: a
    subscription with nothing delivered yet)."""
    return {
        "subscriptionId": str(subscription.subscription_id),
        "tenantId": subscription.tenant_id,
        "kind": subscription.kind,
        "name": subscription.name,
        "url": subscription.url or None,
        "eventTypes": list(subscription.event_types or []),
        "tags": list(subscription.tags or []),
        "enabled": subscription.enabled,
        "createdAt": iso_ms(subscription.created_at),
        "updatedAt": iso_ms(subscription.updated_at),
        "failingSince": iso_ms(subscription.failing_since),
        "lastSuccessAt": iso_ms(subscription.last_success_at),
        "disabledReason": subscription.disabled_reason or None,
        "figures": figures_representation(figures),
        "links": subscription_links(subscription, request=request),
    }


def attempt_representation(row: DeliveryAttempt) -> dict[str, Any]:
    return {
        "n": row.n,
        "trigger": row.trigger,
        "startedAt": iso_ms(row.started_at),
        "latencyMs": row.latency_ms,
        "statusCode": row.status_code,
        "responseSnippet": row.response_snippet or None,
        "error": row.error or None,
    }


def notification_representation(notification: Notification, *, request: Any = None) -> dict[str, Any]:
    """One event for one subscription, with its delivery attempts (prefetched, in order)."""
    links = {}
    if notification.tenant_id:  # a tenant's notification (an operator-wide ping has none)
        kwargs = {"tenant_id": notification.tenant_id, "notification_id": str(notification.notification_id)}
        links["resend"] = _url(request, reverse("api:delivery-resend", kwargs=kwargs))
    return {
        "notificationId": str(notification.notification_id),
        "subscriptionId": str(notification.subscription_id),
        "eventId": str(notification.event_id),
        "eventType": notification.event_type,
        "aggregateId": str(notification.aggregate_id),
        "eventCreatedAt": iso_ms(notification.event_created_at),
        "state": notification.state,
        "attempts": notification.attempts,
        "nextAttemptAt": iso_ms(notification.next_try_at),
        "deliveredAt": iso_ms(notification.delivered_at),
        "lastError": notification.last_error or None,
        "createdAt": iso_ms(notification.created_at),
        "updatedAt": iso_ms(notification.updated_at),
        "deliveryAttempts": [attempt_representation(row) for row in notification.delivery_attempts.all()],
        "links": links,
    }


def call_event_delivery_representation(notification: Notification) -> dict[str, Any]:
    """One subscription's delivery of one event of a call (the call detail's `events[].deliveries`)."""
    return {
        "notificationId": str(notification.notification_id),
        "subscriptionId": str(notification.subscription_id),
        "subscriptionName": notification.subscription.name,
        "state": notification.state,
        "attempts": notification.attempts,
        "nextAttemptAt": iso_ms(notification.next_try_at),
        "deliveredAt": iso_ms(notification.delivered_at),
    }
