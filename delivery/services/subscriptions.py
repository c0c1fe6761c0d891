"""Subscriptions: made, changed, deleted, their signing secrets rotated (docs/events.md)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from core.db.wakeups import Channel, notify
from core.errors import NotFound, ValidationFailed
from core.ids import new_id, utcnow
from core.secrets import RotationResult, rotate_sealed_columns, seal_value
from delivery.channels import channel_for, channels
from delivery.channels.nats import NATS
from delivery.models import PARKED, Notification, Subscription
from delivery.validation import SubscriptionInput
from tenants.models import Tenant
from tenants.selectors import tenant_ceilings_get

# The previous secret keeps signing this long after a rotation (receivers roll their config).
ROTATION_OVERLAP = timedelta(hours=24)


def subscription_create(*, tenant_id: str | None, data: SubscriptionInput) -> tuple[Subscription, str | None]:
    """A subscription, with what its kind's channel stores (delivery/channels/: a webhook's new
    secret, returned once and stored sealed). A tenant has at most its `subscriptions` ceiling
    (docs/flow-control.md, "Operator ceilings"); operator-wide ones are not limited."""
    now = utcnow()
    made = channel_for(data.kind).create(data)
    with transaction.atomic():
        if tenant_id is not None:
            # The tenant's row, locked: two creates never both take the last place.
            list(Tenant.objects.select_for_update().filter(pk=tenant_id).values_list("pk", flat=True))
            limit = tenant_ceilings_get(tenant_id=tenant_id).subscriptions
            if Subscription.objects.filter(tenant_id=tenant_id).count() >= limit:
                raise ValidationFailed(
                    {
                        "body": [
                            f"A tenant may have at most {limit} subscriptions (the operator's ceiling for this "
                            "tenant): delete one first."
                        ]
                    }
                )
        subscription = Subscription.objects.create(
            subscription_id=new_id(),
            tenant_id=tenant_id,
            kind=data.kind,
            name=data.name,
            event_types=list(data.event_types or []),
            tags=list(data.tags or []),
            enabled=True if data.enabled is None else data.enabled,
            created_at=now,
            updated_at=now,
            # The channels' fields as given, then what the kind's own channel stores.
            **{"url": data.url or "", "subject_template": data.subject_template or "", **made.columns},
        )
    return subscription, made.shown_once


def locked_subscription(tenant_id: str | None, subscription_id: uuid.UUID | str) -> Subscription:
    """The subscription of `tenant_id` (None: an operator-wide one), locked for the caller's
    transaction; NotFound when there is none."""
    rows = Subscription.objects.filter(pk=subscription_id)
    rows = rows.filter(tenant__isnull=True) if tenant_id is None else rows.filter(tenant_id=tenant_id)
    subscription = rows.select_for_update().first()
    if subscription is None:
        raise NotFound(f"Subscription {subscription_id} not found.")
    return subscription


def subscription_update(
    *, tenant_id: str | None, subscription_id: uuid.UUID | str, data: SubscriptionInput
) -> Subscription:
    """Change what `data` names (None: unchanged). Enabling clears the disabled reason and the
    failing streak; what failed meanwhile stays FAILED/EXPIRED until `subscription_recover`.
    The notifications that waited while it was disabled are delivered, except those of events
    older than EVENT_DELIVERY_EXPIRY: they are EXPIRED (recoverable like any other)."""
    with transaction.atomic():
        subscription = locked_subscription(tenant_id, subscription_id)
        # A channel's own fields belong to its kind's subscriptions only.
        own = {field.column for field in channel_for(subscription.kind).fields}
        for channel in channels():
            for field in channel.fields:
                if field.column not in own and getattr(data, field.column) is not None:
                    raise ValidationFailed({field.wire: [field.only]})
        for field in ("name", "url", "subject_template", "event_types", "tags"):
            value = getattr(data, field)
            if value is not None:
                setattr(subscription, field, list(value) if field in ("event_types", "tags") else value)
        if data.enabled is not None and data.enabled != subscription.enabled:
            subscription.enabled = data.enabled
            if data.enabled:
                subscription.disabled_reason = ""
                subscription.failing_since = None
                _expire_waiting(subscription)
                notifications_unpark(subscription.subscription_id)
                notify(Channel.DELIVERY)  # what waited while it was disabled
            else:
                subscription.disabled_reason = "disabled by a user"
                notifications_park(subscription.subscription_id)
        subscription.updated_at = utcnow()
        subscription.save()
    return subscription


def notifications_park(subscription_id: uuid.UUID) -> int:
    """The open notifications of a subscription just disabled, but those out on a try, PARKED:
    they wait out of the claims' way (delivery.models.PARKED). Returns how many."""
    now = utcnow()
    return (
        Notification.objects.filter(subscription_id=subscription_id, next_attempt_at__isnull=False)
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lte=now))
        .update(next_attempt_at=PARKED, locked_until=None, claimed_by=None, updated_at=now)
    )


def notifications_unpark(subscription_id: uuid.UUID) -> int:
    """The PARKED notifications of a subscription just enabled, due now (in their order, by
    event): returns how many."""
    now = utcnow()
    return Notification.objects.filter(subscription_id=subscription_id, next_attempt_at=PARKED).update(
        next_attempt_at=now, updated_at=now
    )


# The last error of a notification that waited too long for its subscription to be enabled.
EXPIRED_WHILE_DISABLED = "expired while the subscription was disabled"


def _expire_waiting(subscription: Subscription) -> int:
    """EXPIRE the open notifications of `subscription` whose event is older than the delivery
    expiry (none is out on a try: a disabled subscription's are not claimed, and a lease still
    running is left to its result). Returns how many."""
    now = utcnow()
    return (
        Notification.objects.filter(
            subscription=subscription,
            next_attempt_at__isnull=False,  # open: PENDING or FAILED
            event_created_at__lt=now - timedelta(seconds=settings.EVENT_DELIVERY_EXPIRY),
        )
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lte=now))
        .update(
            state=Notification.State.EXPIRED,
            next_attempt_at=None,
            locked_until=None,
            claimed_by=None,
            last_error=EXPIRED_WHILE_DISABLED,
            updated_at=now,
        )
    )


def subscription_delete(*, tenant_id: str | None, subscription_id: uuid.UUID | str) -> None:
    """Delete it with its notifications and attempts (nothing more is sent to it)."""
    with transaction.atomic():
        locked_subscription(tenant_id, subscription_id).delete()


def subscription_rotate_secret(*, tenant_id: str | None, subscription_id: uuid.UUID | str) -> tuple[Subscription, str]:
    """A new signing secret (returned once); the old one keeps signing for ROTATION_OVERLAP."""
    with transaction.atomic():
        subscription = locked_subscription(tenant_id, subscription_id)
        channel = channel_for(subscription.kind)
        if not channel.signs:
            raise ValidationFailed({"kind": ["Only webhook subscriptions have a signing secret."]})
        secret = channel.new_secret()
        now = utcnow()
        subscription.previous_secret = subscription.secret
        subscription.previous_secret_until = now + ROTATION_OVERLAP
        subscription.secret = seal_value(secret)
        subscription.updated_at = now
        subscription.save()
    return subscription, secret


def subscription_secrets_rotate(*, dry_run: bool = False) -> RotationResult:
    """The webhook subscriptions' signing secrets re-encrypted under the first key of
    FIELD_ENCRYPTION_KEYS (manage.py rotate_secrets); without it, removing the old key would leave
    every webhook unsigned and undelivered."""
    return rotate_sealed_columns(
        Subscription.objects.filter(secret__isnull=False), ("secret", "previous_secret"), dry_run=dry_run
    )


def nats_subscription_ensure() -> Subscription | None:
    """With NATS_URL set, the operator-wide NATS subscription for every event type (created when
    missing; an operator may narrow or disable it in the admin, which is kept)."""
    if not settings.NATS_URL:
        return None
    with transaction.atomic():
        existing = Subscription.objects.filter(tenant__isnull=True, kind=NATS.kind).first()
        if existing is not None:
            return existing
        now = utcnow()
        return Subscription.objects.create(
            subscription_id=new_id(),
            tenant=None,
            kind=NATS.kind,
            name="NATS JetStream",
            subject_template=settings.NATS_SUBJECT_TEMPLATE,
            created_at=now,
            updated_at=now,
        )
