"""Serializers that describe the wire shapes in the OpenAPI schema.

Input is checked by orchestration.validation (one validator for every edge: API, pages,
commands) and output is built by orchestration.representation; these classes document
those shapes for drf-spectacular, and a test keeps them equal to what the builder emits.
"""

from __future__ import annotations

from datetime import datetime

from drf_spectacular.utils import OpenApiParameter, extend_schema_field
from rest_framework import serializers

from core.text import name_pattern, tag_pattern, visible_pattern
from delivery.models import Notification
from eventservice.api.schema import HttpUrlField, ProblemSerializer
from execution.connections import NAME_PATTERN as CONNECTION_NAME_PATTERN
from execution.outcomes import ErrorKind
from execution.targets import HEADER_VALUE_PATTERN, MAX_HEADER_VALUE
from orchestration.models import ServiceCall
from orchestration.retries import (
    BACKOFF_CEILING_MS,
    BACKOFF_FLOOR_MS,
    DEFAULT_MAX_BACKOFF_MS,
    DEFAULT_MIN_BACKOFF_MS,
    MAX_ATTEMPTS,
    RetryOn,
)
from orchestration.validation import MAX_BODY_DEPTH, MAX_IDEMPOTENCY_KEY, METHODS, past_due_warning


@extend_schema_field({"type": "string", "pattern": HEADER_VALUE_PATTERN, "maxLength": MAX_HEADER_VALUE})
class HeaderValueField(serializers.Field):
    """A header's value, empty allowed (execution.targets.header_value_error). Not a CharField:
    drf-spectacular would say an empty one twice, a oneOf that refuses it."""


class RequestSpecSerializer(serializers.Serializer):
    method = serializers.ChoiceField(choices=METHODS)
    url = HttpUrlField(max_length=2048, help_text="Absolute http or https URL.")
    headers = serializers.DictField(
        child=HeaderValueField(),
        required=False,
        help_text="Header name (an RFC 9110 token) to value. In responses, secret values are shown as `***`.",
    )
    body = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text=(
            "A string (sent as is) or any JSON value (sent as JSON). At most 256 KiB, nested at most "
            f"{MAX_BODY_DEPTH} levels; no string or key may hold a NUL (U+0000) or a lone UTF-16 surrogate."
        ),
    )
    timeoutMs = serializers.IntegerField(min_value=1, max_value=120_000, required=False)
    connection = serializers.RegexField(
        CONNECTION_NAME_PATTERN,
        required=False,
        help_text="The name of one of the tenant's connections: each attempt carries its credentials "
        "(docs/connections.md). The request may not set the header the connection sets.",
    )


class ResponseMetaSerializer(serializers.Serializer):
    status = serializers.IntegerField()
    headers = serializers.DictField(child=serializers.CharField())
    bodySnippet = serializers.CharField(allow_null=True)
    bodyTruncated = serializers.BooleanField()
    latencyMs = serializers.IntegerField(allow_null=True)


class ErrorMetaSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=ErrorKind.choices)
    message = serializers.CharField(allow_null=True)
    status = serializers.IntegerField(required=False)
    latencyMs = serializers.IntegerField(required=False)


class OutcomeSerializer(serializers.Serializer):
    responseMeta = ResponseMetaSerializer(required=False, help_text="Set when the call succeeded.")
    errorMeta = ErrorMetaSerializer(required=False, help_text="Set when the call failed.")


class LinksSerializer(serializers.Serializer):
    self = serializers.URLField()
    tags = serializers.URLField()
    rerun = serializers.URLField()
    cancel = serializers.URLField()
    events = serializers.URLField()
    rerunOf = serializers.URLField(required=False)


class RetryPolicySerializer(serializers.Serializer):
    """docs/retries.md; names after Cloud Tasks' RetryConfig."""

    maxAttempts = serializers.IntegerField(
        min_value=1,
        max_value=MAX_ATTEMPTS,
        required=False,
        help_text="Attempts in all, the first included (1: no retry).",
    )
    minBackoffMs = serializers.IntegerField(
        min_value=BACKOFF_FLOOR_MS,
        max_value=BACKOFF_CEILING_MS,
        required=False,
        help_text=f"The first retry's delay (default {DEFAULT_MIN_BACKOFF_MS}); it doubles on each retry, ±10 % jitter.",
    )
    maxBackoffMs = serializers.IntegerField(
        min_value=BACKOFF_FLOOR_MS,
        max_value=BACKOFF_CEILING_MS,
        required=False,
        help_text=f"The longest delay, `Retry-After` included (default {DEFAULT_MAX_BACKOFF_MS}, at least minBackoffMs).",
    )
    retryOn = serializers.ListField(
        child=serializers.ChoiceField(choices=RetryOn.ALL),
        required=False,
        help_text="Failures tried again (default: all four). EgressDenied, TlsError and 4xx other than 429 never are.",
    )
    retryInterrupted = serializers.BooleanField(
        required=False,
        help_text="Try again after Interrupted (the worker died while the request may have been sent): only for "
        "targets that tolerate a duplicate. Default false.",
    )


class ServiceCallSerializer(serializers.Serializer):
    serviceCallId = serializers.UUIDField(help_text="UUID v7, time-ordered.")
    tenantId = serializers.CharField()
    name = serializers.CharField()
    status = serializers.ChoiceField(choices=ServiceCall.Status.choices)
    submittedAt = serializers.DateTimeField()
    dueAt = serializers.DateTimeField()
    startedAt = serializers.DateTimeField(allow_null=True)
    finishedAt = serializers.DateTimeField(allow_null=True)
    requestSpec = RequestSpecSerializer()
    tags = serializers.ListField(child=serializers.CharField())
    favorite = serializers.BooleanField()
    outcome = OutcomeSerializer(allow_null=True, help_text="Set when the call has finished (null when Cancelled).")
    attempt = serializers.IntegerField(help_text="Attempts started so far (0 before the first).")
    retryPolicy = RetryPolicySerializer(allow_null=True)
    nextAttemptAt = serializers.DateTimeField(
        allow_null=True, help_text="When the next attempt is due, while a retry waits (then equal to dueAt)."
    )
    lastError = ErrorMetaSerializer(
        allow_null=True, help_text="The failed attempt a retry follows, until the call finishes."
    )
    scheduleId = serializers.UUIDField(allow_null=True, help_text="The recurring schedule that made this call.")
    occurrenceAt = serializers.DateTimeField(
        allow_null=True, help_text="Which of its schedule's occurrences this call is (UTC)."
    )
    overlap = serializers.CharField(
        allow_null=True, help_text="Its schedule's overlap policy, as the call was made (null: not a schedule's call)."
    )
    overlapState = serializers.CharField(
        allow_null=True,
        help_text="What the overlap policy did: `buffered` (it waited, or waits, for the schedule's earlier call), "
        "`skipped` (cancelled, never ran: an earlier call was still going), `superseded` (cancelled after trying: "
        "a later occurrence took over, cancelOther); null: nothing.",
    )
    heldSince = serializers.DateTimeField(
        allow_null=True,
        help_text="Set while the call is due but waits for room under its tenant's flow-control limits.",
    )
    heldMs = serializers.IntegerField(
        help_text="Milliseconds the call has waited for flow control, over all its attempts (0: never held)."
    )
    correlationId = serializers.CharField()
    links = LinksSerializer()


class ExecutionRequestSerializer(serializers.Serializer):
    method = serializers.CharField()
    url = serializers.CharField()
    headers = serializers.DictField(child=serializers.CharField())
    bodySnippet = serializers.CharField(allow_null=True)
    timeoutMs = serializers.IntegerField()


class ExecutionResponseSerializer(serializers.Serializer):
    status = serializers.IntegerField()
    headers = serializers.DictField(child=serializers.CharField())
    bodySnippet = serializers.CharField(allow_null=True)
    bodyTruncated = serializers.BooleanField()


class ExecutionErrorSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=ErrorKind.choices)
    message = serializers.CharField(allow_null=True)


class ExecutionSerializer(serializers.Serializer):
    executionId = serializers.UUIDField()
    attempt = serializers.IntegerField()
    state = serializers.CharField()
    startedAt = serializers.DateTimeField()
    finishedAt = serializers.DateTimeField(allow_null=True)
    request = ExecutionRequestSerializer()
    response = ExecutionResponseSerializer(allow_null=True)
    latencyMs = serializers.IntegerField(allow_null=True)
    error = ExecutionErrorSerializer(allow_null=True)
    connection = serializers.CharField(
        required=False, help_text="The connection whose credentials the attempt carried (docs/connections.md)."
    )
    earlierTries = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="The tries before this one within the attempt: a target's 401, after which the connection's "
        "OAuth2 token was fetched again and the request sent once more (`status`, `latencyMs`, `note`).",
    )


class EventSerializer(serializers.Serializer):
    id = serializers.UUIDField(help_text="Envelope id (UUID v7).")
    type = serializers.CharField()
    tenantId = serializers.CharField()
    aggregateId = serializers.UUIDField(help_text="The service call's id.")
    timestampMs = serializers.IntegerField()
    correlationId = serializers.CharField()
    causationId = serializers.CharField(allow_null=True)
    payload = serializers.DictField()
    sequence = serializers.IntegerField(help_text="Outbox sequence: the order of a call's events.")
    publishedAt = serializers.DateTimeField(allow_null=True)


class EventDeliverySerializer(serializers.Serializer):
    """One subscription's delivery of a call's event (delivery.representation)."""

    notificationId = serializers.UUIDField()
    subscriptionId = serializers.UUIDField()
    subscriptionName = serializers.CharField()
    state = serializers.ChoiceField(choices=Notification.State.values)
    attempts = serializers.IntegerField()
    nextAttemptAt = serializers.DateTimeField(allow_null=True)
    deliveredAt = serializers.DateTimeField(allow_null=True)


class CallEventSerializer(EventSerializer):
    deliveries = EventDeliverySerializer(
        many=True, help_text="Its deliveries to the tenant's own subscriptions (operator-wide ones are not shown)."
    )


class ServiceCallDetailSerializer(ServiceCallSerializer):
    executions = ExecutionSerializer(many=True)
    events = CallEventSerializer(many=True)


class ServiceCallPageSerializer(serializers.Serializer):
    results = ServiceCallSerializer(many=True)
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)


class EventFeedSerializer(serializers.Serializer):
    data = EventSerializer(many=True, help_text="Published events, oldest first.")
    iterator = serializers.CharField(
        help_text="Pass as `after` to read on. Opaque; when nothing is new, the same position again."
    )
    done = serializers.BooleanField(help_text="True when the feed has no more events now (fewer than `limit`).")


TAG_PATTERN = tag_pattern()


def _tag_list(**kwargs) -> serializers.ListField:
    return serializers.ListField(child=serializers.RegexField(TAG_PATTERN, max_length=64), max_length=20, **kwargs)


class SubmitServiceCallSerializer(serializers.Serializer):
    name = serializers.RegexField(name_pattern(), max_length=200)
    requestSpec = RequestSpecSerializer()
    dueAt = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="ISO 8601 with a time zone, at most one year ahead; absent or past means now.",
    )
    tags = _tag_list(required=False)
    idempotencyKey = serializers.RegexField(
        visible_pattern(), max_length=MAX_IDEMPOTENCY_KEY, required=False, help_text="Or the Idempotency-Key header."
    )
    retryPolicy = RetryPolicySerializer(required=False, allow_null=True)


class TagsInputSerializer(serializers.Serializer):
    tags = _tag_list()


class RerunInputSerializer(serializers.Serializer):
    dueAt = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="As a submission's: ISO 8601 with a time zone, at most one year ahead; absent or past means now.",
    )


# A filter's bound: a date-time, a date, or empty (no bound).
INSTANT = {"type": "string", "anyOf": [{"format": "date-time"}, {"format": "date"}, {"maxLength": 0}]}
INSTANT_HELP = "ISO 8601 date-time with a zone, or a date (YYYY-MM-DD, UTC)."


@extend_schema_field(INSTANT)
class InstantField(serializers.CharField):
    def __init__(self, **kwargs):
        super().__init__(allow_blank=True, help_text=INSTANT_HELP, **kwargs)


class BulkFilterSerializer(serializers.Serializer):
    status = serializers.ListField(child=serializers.ChoiceField(choices=ServiceCall.Status.values), required=False)
    tag = _tag_list(required=False, help_text="All of these.")
    q = serializers.CharField(required=False, help_text="Name contains (case-insensitive).")
    submittedFrom = InstantField(required=False)
    submittedTo = InstantField(required=False)
    dueFrom = InstantField(required=False)
    dueTo = InstantField(required=False)
    favorite = serializers.BooleanField(required=False)
    scheduleId = serializers.UUIDField(required=False, help_text="The calls a schedule made.")


class BulkInputSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=["cancel", "rerun", "addTags", "removeTags"])
    filter = BulkFilterSerializer(help_text="The list's filters; {} matches every call of the tenant.")
    tags = _tag_list(required=False, help_text="addTags and removeTags only.")
    dryRun = serializers.BooleanField(
        required=False, help_text="true: count the calls it would act on, change nothing."
    )


class BulkOutputSerializer(serializers.Serializer):
    action = serializers.CharField()
    dryRun = serializers.BooleanField()
    matched = serializers.IntegerField(help_text="Calls the filter matches (acted on: at most limit).")
    limit = serializers.IntegerField(help_text="Calls one request acts on, at most (more: a 400, nothing done).")
    changed = serializers.IntegerField(help_text="Cancelled, run again, or their tags changed (0 on a dry run).")
    unchanged = serializers.IntegerField(help_text="Already so (cancelled, tagged, untagged).")
    skipped = serializers.IntegerField(help_text="The transition was refused (a call no longer Scheduled, ...).")
    reasons = serializers.DictField(child=serializers.IntegerField(), help_text="Why calls were skipped, counted.")


class BatchInputSerializer(serializers.Serializer):
    calls = serializers.ListField(
        child=SubmitServiceCallSerializer(),
        min_length=1,
        max_length=100,
        help_text="1 to 100 calls, each as `POST .../service-calls` takes one.",
    )


class BatchItemSerializer(serializers.Serializer):
    status = serializers.IntegerField(
        help_text="As the single submission would answer: 202 stored now, 200 stored earlier under its idempotency "
        "key, 400 refused (the call not stored), 409 its idempotency key used with another payload."
    )
    call = ServiceCallSerializer(required=False, help_text="The call, for 202 and 200.")
    problem = ProblemSerializer(required=False, help_text="Why the item was refused, for 400 and 409.")
    warning = serializers.CharField(
        required=False,
        help_text='For a 202 whose dueAt was more than a minute in the past: "dueAt ... is in the past: the call is '
        'due now." (a single submission says it in a `Warning` header).',
    )


class BatchOutputSerializer(serializers.Serializer):
    results = BatchItemSerializer(many=True, help_text="One per item, in the items' order.")
    accepted = serializers.IntegerField(help_text="Items stored by this request.")
    replayed = serializers.IntegerField(help_text="Items answered with the call stored earlier under their key.")
    refused = serializers.IntegerField(help_text="Items refused; nothing of them is stored.")


def past_due_headers(due_at: datetime | None) -> dict[str, str]:
    """`Warning: 299` (as Kubernetes' API warns) when the given dueAt was in the past: the call is
    kept, due now (docs/api.md, "Service calls")."""
    warning = past_due_warning(due_at)
    return {"Warning": f'299 - "{warning}"'} if warning else {}


IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "pattern": visible_pattern(), "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY},
    OpenApiParameter.HEADER,
    description="Same as the body's idempotencyKey (both given: equal).",
)

PAST_DUE_HEADER = OpenApiParameter(
    "Warning",
    str,
    OpenApiParameter.HEADER,
    response=[202],
    description='`299 - "dueAt ... is in the past: the call is due now."` when the given `dueAt` was more than a '
    "minute in the past: the call is kept and runs at once.",
)
