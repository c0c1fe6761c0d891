"""Submit: a call stored Scheduled with its tags, events and timer, in one transaction shared with
the submissions other threads of this process make at the same moment (docs/architecture.md,
"The path of one call").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from core.db import PreparedInsert, group_commit, insert_prepare, insert_rows_prepare
from core.errors import Conflict, ValidationFailed
from core.ids import iso_ms, new_id, utcnow
from core.secrets import seal_headers
from execution.connections import connection_check
from orchestration.flow import target_host
from orchestration.models import ServiceCall, ServiceCallTag
from orchestration.retries import (
    RetryPolicy,
    policy_capped,
    policy_ceiling_errors,
)
from orchestration.services.calls import (
    EVENT_BODY_SNIPPET,
    Occurrence,
    call_event,
    enqueue_start,
    public_request_spec,
)
from orchestration.validation import Submission
from outbox.models import OutboxEvent
from outbox.services import NewEvent, PreparedEvents, outbox_append, outbox_prepare
from tenants.selectors import tenant_ceilings_get
from timer.services import timer_register


def _fingerprint(submission: Submission) -> str:
    # Keyed: the payload holds secret header values, which a bare hash would let anyone with
    # the database try to guess.
    canonical = json.dumps(submission.fingerprint_payload(), sort_keys=True, separators=(",", ":"))
    return hmac.new(settings.SECRET_KEY.encode(), canonical.encode(), hashlib.sha256).hexdigest()


def service_call_submit(
    *,
    tenant_id: str,
    submission: Submission,
    correlation_id: str,
    rerun_of: uuid.UUID | None = None,
    sealed_headers: dict[str, Any] | None = None,
    occurrence: Occurrence | None = None,
) -> tuple[ServiceCall, bool]:
    """Store a call as Scheduled with its tags, events and timer. Returns (call, created).

    A reused idempotency key with the same payload returns the existing call (created=False);
    with a different payload it raises Conflict. `occurrence` marks the call a schedule makes: an occurrence already made returns that call
    (created=False), whoever made it.
    """
    if submission.retry_policy is not None:
        # Within the operator's ceilings: refused at the edge, brought within them for a
        # schedule's occurrence (its policy was accepted under the ceilings of its day).
        submission = replace(
            submission,
            retry_policy=retry_policy_within_ceilings(
                tenant_id=tenant_id, policy=submission.retry_policy, cap=occurrence is not None
            ),
        )
    if occurrence is None:  # a schedule's connection was checked when the schedule was stored
        connection_check(
            tenant_id=tenant_id,
            name=submission.connection,
            header_names=submission.headers,
            field="requestSpec.connection",
        )
    fingerprint = _fingerprint(submission)
    if submission.idempotency_key is not None:
        existing = _idempotent_match(tenant_id, submission.idempotency_key, fingerprint)
        if existing is not None:
            return existing, False
    new = _new_call(
        tenant_id=tenant_id,
        submission=submission,
        correlation_id=correlation_id,
        fingerprint=fingerprint,
        rerun_of=rerun_of,
        sealed_headers=sealed_headers,
        occurrence=occurrence,
    )
    try:
        # Concurrent submissions of this process share one transaction (docs/architecture.md).
        call = group_commit(lambda: _insert_call(new))
    except IntegrityError:
        if occurrence is not None:
            # Another cluster made this occurrence first (service_calls_schedule_occurrence).
            existing = (
                ServiceCall.objects.filter(
                    tenant_id=tenant_id, schedule_id=occurrence.schedule_id, occurrence_at=occurrence.at
                )
                .exclude(status=ServiceCall.Status.CANCELLED)
                .first()
            )
            if existing is None:
                raise
            return existing, False
        # Two requests raced with one idempotency key: the other one stored first.
        if submission.idempotency_key is None:
            raise
        existing = _idempotent_match(tenant_id, submission.idempotency_key, fingerprint)
        if existing is None:
            raise
        return existing, False
    return call, True


def retry_policy_within_ceilings(*, tenant_id: str, policy: RetryPolicy, cap: bool = False) -> RetryPolicy:
    """`policy` if it keeps within the tenant's ceilings on retries (docs/retries.md, "Operator
    ceilings"), else ValidationFailed naming the field and the ceiling; with `cap`, the policy
    brought within them instead."""
    ceilings = tenant_ceilings_get(tenant_id=tenant_id)
    bounds = {"max_attempts": ceilings.max_attempts, "min_backoff_ms": ceilings.min_backoff_ms}
    errors = policy_ceiling_errors(policy, **bounds)
    if not policy.min_backoff_given:  # the default backoff: raised to the floor, not refused
        errors.pop("retryPolicy.minBackoffMs", None)
    if errors and not cap:
        raise ValidationFailed(errors)
    return policy_capped(policy, **bounds)


def _idempotent_match(tenant_id: str, key: str, fingerprint: str) -> ServiceCall | None:
    existing = ServiceCall.objects.filter(tenant_id=tenant_id, idempotency_key=key).first()
    if existing is None:
        return None
    if existing.request_fingerprint != fingerprint:
        raise Conflict(
            f"Idempotency key {key!r} was already used with a different payload "
            f"(service call {existing.service_call_id})."
        )
    return existing


@dataclass(frozen=True)
class _NewCall:
    """A submission's writes, made ready before its transaction (`_new_call`): the transaction
    then holds the write lock only for the four INSERTs."""

    call: ServiceCall
    call_insert: PreparedInsert
    tags_insert: PreparedInsert
    events: PreparedEvents
    correlation_id: str
    due_now: bool
    # The same rows as values, for a batch's one INSERT per table (orchestration/services/batch.py).
    tag_rows: list[tuple[str, uuid.UUID, str]]
    new_events: list[NewEvent]


def _new_call(
    *,
    tenant_id: str,
    submission: Submission,
    correlation_id: str,
    fingerprint: str,
    rerun_of: uuid.UUID | None,
    sealed_headers: dict[str, Any] | None,
    occurrence: Occurrence | None,
) -> _NewCall:
    # The id and the time are taken here, before the write lock: on SQLite two submissions
    # waiting for it may then commit in another order than their ids, as concurrent
    # transactions on PostgreSQL always could.
    now = utcnow()
    due_at = submission.due_at if submission.due_at and submission.due_at > now else now
    spec = {
        "method": submission.method,
        "url": submission.url,
        "headers": sealed_headers if sealed_headers is not None else seal_headers(submission.headers),
        "body": submission.body,
        "timeoutMs": submission.timeout_ms,
        **({"connection": submission.connection} if submission.connection else {}),
    }
    call = ServiceCall(
        service_call_id=new_id(),
        tenant_id=tenant_id,
        name=submission.name,
        status=ServiceCall.Status.SCHEDULED,
        submitted_at=now,
        due_at=due_at,
        request_spec=spec,
        correlation_id=correlation_id,
        idempotency_key=submission.idempotency_key,
        request_fingerprint=fingerprint,
        rerun_of=rerun_of,
        retry_policy=submission.retry_policy.as_wire() if submission.retry_policy else None,
        schedule_id=occurrence.schedule_id if occurrence else None,
        occurrence_at=occurrence.at if occurrence else None,
        overlap=occurrence.overlap if occurrence else "",
        target_host=target_host(submission.url),
    )
    new_events = [
        call_event(
            call,
            OutboxEvent.Type.SUBMITTED,
            {
                "name": call.name,
                "requestSpec": public_request_spec(spec, body_limit=EVENT_BODY_SNIPPET),
                "submittedAt": iso_ms(now),
                "dueAt": iso_ms(due_at),
                "tags": submission.tags,
                **({"retryPolicy": call.retry_policy} if call.retry_policy else {}),
                **(
                    {"scheduleId": str(occurrence.schedule_id), "occurrenceAt": iso_ms(occurrence.at)}
                    if occurrence
                    else {}
                ),
                **({"rerunOf": str(rerun_of)} if rerun_of else {}),
            },
            now,
        ),
        call_event(call, OutboxEvent.Type.SCHEDULED, {"dueAt": iso_ms(due_at)}, now),
    ]
    tag_rows = [(tenant_id, call.service_call_id, tag) for tag in submission.tags]
    return _NewCall(
        call=call,
        call_insert=insert_prepare([call]),
        tags_insert=insert_rows_prepare(ServiceCallTag, fields=("tenant", "service_call", "tag"), rows=tag_rows),
        events=outbox_prepare(events=new_events),
        correlation_id=correlation_id,
        due_now=due_at <= now,
        tag_rows=tag_rows,
        new_events=new_events,
    )


def _insert_call(new: _NewCall) -> ServiceCall:
    """A submission's writes, inside its transaction: the call, its tags, its Submitted and
    Scheduled events, its timer."""
    call = new.call
    new.call_insert.run()
    new.tags_insert.run()
    outbox_append(prepared=new.events)
    timer_register(
        tenant_id=call.tenant_id,
        service_call_id=call.service_call_id,
        due_at=call.due_at,
        correlation_id=new.correlation_id,
    )
    if new.due_now:
        # Past due: a worker starts it at once instead of waiting for the timer (rule 4).
        transaction.on_commit(lambda: enqueue_start(call.tenant_id, call.service_call_id))
    return call
