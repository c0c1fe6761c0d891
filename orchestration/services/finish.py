"""Finish: Running -> Succeeded | Failed with the outcome, or Running -> Scheduled when the call's
retry policy tries the failure again (docs/retries.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction

from core.db import update_many
from core.ids import iso_ms, utcnow
from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall
from orchestration.retries import (
    RetryPolicy,
    next_attempt_at,
    should_retry,
)
from orchestration.services.calls import CallKey, call_event, enqueue_start
from orchestration.services.overlap import overlap_release
from outbox.models import OutboxEvent
from outbox.services import outbox_append
from timer.services import timer_rearm


def service_calls_finish(*, results: Sequence[tuple[CallKey, Outcome]]) -> int:
    """Running -> Succeeded | Failed with the outcome, or Running -> Scheduled when the call's
    retry policy tries a failed attempt again (docs/retries.md); returns how many calls changed.

    An outcome whose key names an attempt other than the call's current one changes nothing.
    """
    if not results:
        return 0
    # No savepoint when nested (a failure rolls back the caller's whole transaction, as every
    # caller wants): a SAVEPOINT and its RELEASE are two more statements under the write lock.
    with transaction.atomic(savepoint=False):
        now = utcnow()
        # Under the row locks (the write lock on SQLite) the Running set cannot change before
        # the updates below: reading it first tells which calls this finish moves.
        running = {
            row[0]: row[1:]
            for row in ServiceCall.objects.select_for_update()
            .filter(pk__in=[key.service_call_id for key, _ in results], status=ServiceCall.Status.RUNNING)
            .values_list("service_call_id", "correlation_id", "attempts", "retry_policy", "schedule_id")
        }
        ended = set()  # the schedules a call of which ends: the call one buffers may start
        rows, events, retries = [], [], []
        for key, outcome in results:
            found = running.pop(key.service_call_id, None)  # pop: a duplicate counts once
            if found is None:
                continue
            correlation_id, attempt, policy, schedule_id = found
            if key.attempt is not None and key.attempt != attempt:
                continue
            call = ServiceCall(
                service_call_id=key.service_call_id, tenant_id=key.tenant_id, correlation_id=correlation_id
            )
            meta = outcome.as_meta()
            if policy and should_retry(RetryPolicy.from_wire(policy), outcome, attempt=attempt):
                retries.append(
                    (
                        call,
                        attempt,
                        meta,
                        next_attempt_at(RetryPolicy.from_wire(policy), outcome, attempt=attempt, now=now),
                    )
                )
                continue
            status = ServiceCall.Status.SUCCEEDED if outcome.succeeded else ServiceCall.Status.FAILED
            if schedule_id is not None:
                ended.add((key.tenant_id, schedule_id))
            rows.append(
                (
                    status,
                    now,
                    meta,
                    None if outcome.succeeded else outcome.error_kind,
                    key.service_call_id,
                    key.tenant_id,
                )
            )
            type_ = OutboxEvent.Type.SUCCEEDED if outcome.succeeded else OutboxEvent.Type.FAILED
            events.append(call_event(call, type_, {"finishedAt": iso_ms(now), "attempt": attempt, **meta}, now))
        update_many(
            ServiceCall,
            set_fields=["status", "finished_at", "outcome_meta", "error_kind"],
            where_fields=["service_call_id", "tenant"],
            rows=rows,
            where_extra={"status": ServiceCall.Status.RUNNING},
        )
        for call, attempt, meta, due_at in retries:
            _schedule_retry(call, attempt=attempt, last_error=meta, due_at=due_at, now=now)
            events.append(
                call_event(
                    call,
                    OutboxEvent.Type.RETRY_SCHEDULED,
                    {"attempt": attempt, "nextAttemptAt": iso_ms(due_at), "lastError": meta.get("errorMeta")},
                    now,
                )
            )
        if events:
            outbox_append(events=events)
        overlap_release(ended, now=now)
    return len(rows) + len(retries)


def _schedule_retry(
    call: ServiceCall, *, attempt: int, last_error: dict[str, Any], due_at: datetime, now: datetime
) -> None:
    """Running -> Scheduled for the next attempt: due later, its timer armed again. The last
    attempt's error stays in outcome_meta until the call finishes."""
    ServiceCall.objects.filter(
        pk=call.service_call_id, tenant_id=call.tenant_id, status=ServiceCall.Status.RUNNING, attempts=attempt
    ).update(status=ServiceCall.Status.SCHEDULED, due_at=due_at, started_at=None, outcome_meta=last_error)
    timer_rearm(
        tenant_id=call.tenant_id,
        service_call_id=call.service_call_id,
        due_at=due_at,
        correlation_id=call.correlation_id,
    )
    if due_at <= now:
        transaction.on_commit(lambda: enqueue_start(call.tenant_id, call.service_call_id))


def service_call_finish(*, tenant_id: str, service_call_id: uuid.UUID, outcome: Outcome) -> bool:
    return service_calls_finish(results=[(CallKey(tenant_id, service_call_id), outcome)]) == 1


def service_call_interrupt(*, tenant_id: str, service_call_id: uuid.UUID, reason: str) -> bool:
    """Finish a Running call whose request may have been sent: never send it again."""
    outcome = Outcome.failure(ErrorKind.INTERRUPTED, reason)
    return service_call_finish(tenant_id=tenant_id, service_call_id=service_call_id, outcome=outcome)
