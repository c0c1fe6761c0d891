"""The attempt log's writes. A row is committed *before* the request goes out, so after a
crash "no row" means never sent and "row still Sending" means it may have been sent. The row
records the headers exactly as they will be sent (execution.wire.sent_headers), secret values
redacted."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from core.db import insert_new, update_many
from core.ids import new_id, utcnow
from core.secrets import REDACTED, redact_headers
from execution.models import HttpExecution
from execution.outcomes import ErrorKind, Outcome
from execution.wire import HttpRequest, sent_body, sent_headers

REQUEST_BODY_SNIPPET = 4096


@dataclass(frozen=True)
class AttemptOrder:
    """What to send for one call (plaintext headers, never stored as given)."""

    tenant_id: str
    service_call_id: uuid.UUID
    correlation_id: str
    request: HttpRequest
    # The call's attempt number (1, 2, ...): the claim is unique per (call, attempt).
    attempt: int = 1
    # Not sent before this instant (seconds since the epoch), when set: the start that flow
    # control's rate gave the call (docs/flow-control.md).
    not_before: float | None = None


@dataclass(frozen=True)
class Attempt:
    execution_id: uuid.UUID
    order: AttemptOrder


def attempts_begin(*, orders: Sequence[AttemptOrder], worker_id: str) -> list[Attempt]:
    """Claim the right to send: insert the attempt rows; returns the ones this caller owns.

    The unique (tenant, call, attempt) constraint makes the insert the claim: an attempt some
    other worker already claimed is skipped, so no attempt is sent twice.
    """
    if not orders:
        return []
    now = utcnow()
    rows = []
    for order in orders:
        body = sent_body(request=order.request)  # encoded once: the same bytes the attempt sends
        rows.append(
            HttpExecution(
                execution_id=new_id(),
                tenant_id=order.tenant_id,
                service_call_id=order.service_call_id,
                attempt=order.attempt,
                state=HttpExecution.State.SENDING,
                worker_id=worker_id,
                started_at=now,
                request_url=order.request.url,
                request_method=order.request.method,
                request_headers=_logged_headers(order.request),
                request_body=body[:REQUEST_BODY_SNIPPET].decode("utf-8", "replace") if body else None,
                timeout_ms=order.request.timeout_ms,
                connection_name=order.request.credential.name if order.request.credential else "",
            )
        )
    # No savepoint when nested (a failure rolls back the caller's whole transaction, as every
    # caller wants): a SAVEPOINT and its RELEASE are two more statements under the write lock.
    with transaction.atomic(savepoint=False):
        owned = insert_new(rows)
    return [
        Attempt(row.execution_id, order) for row, order in zip(rows, orders, strict=True) if row.execution_id in owned
    ]


def _logged_headers(request: HttpRequest) -> dict[str, str]:
    """The headers as sent, secret values redacted: the connection's header whatever its name."""
    headers = redact_headers(sent_headers(request=request))
    if request.credential is not None:
        for name in headers:
            if name.lower() == request.credential.header.lower():
                headers[name] = REDACTED
    return headers


def attempts_finish(*, results: Sequence[tuple[Attempt, Outcome]]) -> None:
    """Record outcomes; an attempt already marked Interrupted keeps that verdict. An outcome
    that says when its request set out (Outcome.started_at) gives the attempt that start."""
    if not results:
        return
    now = utcnow()
    names = list(_outcome_fields(results[0][1]))
    # No savepoint when nested (a failure rolls back the caller's whole transaction, as every
    # caller wants): a SAVEPOINT and its RELEASE are two more statements under the write lock.
    with transaction.atomic(savepoint=False):
        for set_out in (True, False):
            update_many(
                HttpExecution,
                set_fields=[*names, "state", "finished_at", *(["started_at"] if set_out else [])],
                where_fields=["execution_id"],
                rows=[
                    (
                        *_outcome_fields(outcome).values(),
                        HttpExecution.State.FINISHED,
                        now,
                        *([outcome.started_at] if set_out else []),
                        attempt.execution_id,
                    )
                    for attempt, outcome in results
                    if (outcome.started_at is not None) is set_out
                ],
                where_extra={"state": HttpExecution.State.SENDING},
            )


def _outcome_fields(outcome: Outcome) -> dict[str, Any]:
    return {
        "response_status": outcome.status,
        "response_headers": redact_headers(outcome.headers) if outcome.headers else None,
        "response_body": outcome.body_snippet,
        "response_body_truncated": outcome.body_truncated,
        "latency_ms": outcome.latency_ms,
        "error_kind": outcome.error_kind,
        "error_message": outcome.error_message,
        "earlier_tries": list(outcome.earlier_tries) or None,
    }


def attempts_interrupt(*, execution_ids: Sequence[uuid.UUID], reason: str) -> list[uuid.UUID]:
    """Sending -> Interrupted for attempts whose worker died; returns the ones changed."""
    changed = []
    with transaction.atomic():
        now = utcnow()
        for execution_id in execution_ids:
            if HttpExecution.objects.filter(execution_id=execution_id, state=HttpExecution.State.SENDING).update(
                state=HttpExecution.State.INTERRUPTED,
                finished_at=now,
                error_kind=ErrorKind.INTERRUPTED,
                error_message=reason,
            ):
                changed.append(execution_id)
    return changed


def outcome_of(execution: HttpExecution) -> Outcome:
    """The recorded outcome of a finished attempt."""
    if execution.state == HttpExecution.State.INTERRUPTED:
        return Outcome.failure(ErrorKind.INTERRUPTED, execution.error_message or "interrupted")
    if execution.error_kind is None:
        return Outcome(
            succeeded=True,
            status=execution.response_status,
            headers=execution.response_headers or {},
            body_snippet=execution.response_body,
            body_truncated=execution.response_body_truncated,
            latency_ms=execution.latency_ms,
            earlier_tries=tuple(execution.earlier_tries or ()),
        )
    return Outcome(
        succeeded=False,
        status=execution.response_status,
        headers=execution.response_headers or {},
        body_snippet=execution.response_body,
        body_truncated=execution.response_body_truncated,
        latency_ms=execution.latency_ms,
        error_kind=execution.error_kind,
        error_message=execution.error_message,
        earlier_tries=tuple(execution.earlier_tries or ()),
    )
