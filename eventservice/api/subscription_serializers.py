"""Serializers that describe the subscription API's wire shapes in the OpenAPI schema.

Input is checked by delivery.validation (one validator for the API, the dashboard, the admin
and the commands) and output is built by delivery.representation; these classes document
those shapes for drf-spectacular, and tests/api/test_subscriptions_schema.py keeps them equal
to what the builders emit.
"""

from __future__ import annotations

from rest_framework import serializers

from core.text import name_pattern, tag_pattern
from delivery.channels import kinds, tenant_kinds
from delivery.models import DeliveryAttempt, Notification
from delivery.validation import EVENT_TYPES, MAX_NAME
from eventservice.api.schema import HttpUrlField

NAME_PATTERN = name_pattern()
# The kinds a tenant may make (delivery/channels/): `^webhook$`.
_TENANT_KINDS = tenant_kinds()
KIND_PATTERN = f"^{_TENANT_KINDS[0]}$" if len(_TENANT_KINDS) == 1 else f"^(?:{'|'.join(_TENANT_KINDS)})$"


def _event_types(**kwargs) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.ChoiceField(choices=EVENT_TYPES),
        help_text="The event types it receives; empty: all.",
        **kwargs,
    )


def _tags(**kwargs) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.RegexField(tag_pattern(), max_length=64),
        max_length=20,
        help_text="Only the events of calls carrying one of these tags (as the call has them when its event is "
        "fanned out); empty: every call's.",
        **kwargs,
    )


class CreateSubscriptionSerializer(serializers.Serializer):
    # A pattern, not an enum: a second choice set for a field named `kind` (beside the outcome's
    # ErrorKind) would make drf-spectacular invent hashed enum names.
    kind = serializers.RegexField(
        KIND_PATTERN,
        required=False,
        help_text="`webhook` (the default): tenants make webhooks; NATS is configured by the operator.",
    )
    name = serializers.RegexField(NAME_PATTERN, max_length=MAX_NAME)
    url = HttpUrlField(
        max_length=2048,
        help_text="Absolute http or https URL; it passes the same egress policy as a call's URL.",
    )
    eventTypes = _event_types(required=False)
    tags = _tags(required=False)
    enabled = serializers.BooleanField(required=False, help_text="Default true.")


class UpdateSubscriptionSerializer(serializers.Serializer):
    """What a PATCH may change; an absent field stays as it is. `kind` cannot change."""

    name = serializers.RegexField(NAME_PATTERN, max_length=MAX_NAME, required=False)
    url = HttpUrlField(max_length=2048, required=False)
    eventTypes = _event_types(required=False)
    tags = _tags(required=False)
    enabled = serializers.BooleanField(
        required=False,
        help_text="false disables it; true enables it again (what failed meanwhile: `recover`).",
    )


class RecoverInputSerializer(serializers.Serializer):
    since = serializers.DateTimeField(
        help_text="ISO 8601 with a time zone, not in the future: FAILED and EXPIRED deliveries of "
        "events from then on are tried again."
    )


class SubscriptionFiguresSerializer(serializers.Serializer):
    pending = serializers.IntegerField(help_text="Open deliveries (PENDING or FAILED).")
    lagP50Ms = serializers.IntegerField(
        allow_null=True, help_text="Median delivery lag (delivered − event time) over the last hour."
    )
    lagP99Ms = serializers.IntegerField(allow_null=True, help_text="99th percentile of the same.")
    lagSample = serializers.IntegerField(help_text="How many deliveries the lag is measured over.")
    lagWindowMinutes = serializers.IntegerField()


class SubscriptionLinksSerializer(serializers.Serializer):
    self = serializers.URLField()
    deliveries = serializers.URLField()
    rotateSecret = serializers.URLField()
    test = serializers.URLField()
    recover = serializers.URLField()


class SubscriptionSerializer(serializers.Serializer):
    subscriptionId = serializers.UUIDField()
    tenantId = serializers.CharField()
    kind = serializers.CharField(help_text=f"One of: {', '.join(kinds())}.")
    name = serializers.CharField()
    url = serializers.CharField(allow_null=True, help_text="A webhook's endpoint.")
    eventTypes = serializers.ListField(child=serializers.CharField(), help_text="Empty: all.")
    tags = serializers.ListField(
        child=serializers.CharField(), help_text="Only calls carrying one of them; empty: all."
    )
    enabled = serializers.BooleanField()
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()
    failingSince = serializers.DateTimeField(
        allow_null=True, help_text="Since when every try has failed (null while it delivers)."
    )
    lastSuccessAt = serializers.DateTimeField(allow_null=True)
    disabledReason = serializers.CharField(allow_null=True)
    figures = SubscriptionFiguresSerializer()
    links = SubscriptionLinksSerializer()


class CreatedSubscriptionSerializer(SubscriptionSerializer):
    secret = serializers.CharField(
        help_text="The signing secret (`whsec_…`, Standard Webhooks). Shown this once: keep it."
    )


class SubscriptionPageSerializer(serializers.Serializer):
    results = SubscriptionSerializer(many=True)
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)


class SecretSerializer(serializers.Serializer):
    secret = serializers.CharField(
        help_text="The new signing secret, shown this once; the previous one keeps signing for 24 hours."
    )


class RequeuedSerializer(serializers.Serializer):
    requeued = serializers.IntegerField(help_text="How many deliveries are tried again.")


class DeliveryAttemptSerializer(serializers.Serializer):
    n = serializers.IntegerField()
    trigger = serializers.ChoiceField(choices=DeliveryAttempt.Trigger.values)
    startedAt = serializers.DateTimeField()
    latencyMs = serializers.IntegerField(allow_null=True)
    statusCode = serializers.IntegerField(allow_null=True)
    responseSnippet = serializers.CharField(allow_null=True)
    error = serializers.CharField(allow_null=True)


class DeliveryLinksSerializer(serializers.Serializer):
    resend = serializers.URLField()


class DeliverySerializer(serializers.Serializer):
    notificationId = serializers.UUIDField()
    subscriptionId = serializers.UUIDField()
    eventId = serializers.UUIDField()
    eventType = serializers.CharField()
    aggregateId = serializers.UUIDField(help_text="The service call's id (a test event: its own).")
    eventCreatedAt = serializers.DateTimeField()
    state = serializers.ChoiceField(choices=Notification.State.values)
    attempts = serializers.IntegerField(help_text="Tries so far.")
    nextAttemptAt = serializers.DateTimeField(allow_null=True)
    deliveredAt = serializers.DateTimeField(allow_null=True)
    lastError = serializers.CharField(allow_null=True)
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()
    deliveryAttempts = DeliveryAttemptSerializer(many=True, help_text="Every try, first to last.")
    links = DeliveryLinksSerializer()


class DeliveryPageSerializer(serializers.Serializer):
    results = DeliverySerializer(many=True)
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
