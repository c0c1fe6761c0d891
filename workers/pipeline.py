"""The path of a due call through the modules, shared by the engine, tasks and recovery.

DueTimeReached -> orchestration starts the call -> execution claims and performs the attempt
-> orchestration finishes the call. Starting and claiming share one transaction; recording
is another; no HTTP inside either.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from datetime import datetime

from django.db import transaction

from core.ids import utcnow
from core.logging import log_context
from execution.credentials import Credential, credentials_for, send, with_credential
from execution.http import HttpRequest
from execution.outcomes import Outcome
from execution.services import Attempt, AttemptOrder, attempts_begin, attempts_finish
from execution.signing import signed
from orchestration.services import (
    CallKey,
    StartedCall,
    service_calls_finish,
    service_calls_start,
    service_calls_start_overdue,
)

logger = logging.getLogger("serviceagent.pipeline")

# Due calls started (and their attempts claimed) per transaction by the engine's timer and
# backlog loops, at most; never more than the execution pool has free threads for, so a claimed
# attempt leaves at once (an attempt claimed but queued would be Interrupted, not resent, if the
# process died).
START_CHUNK = 100


def order_for(call: StartedCall, credential: Credential | None = None) -> AttemptOrder:
    """The attempt to send: the call's request, plus the headers by which a receiver knows the
    call and the attempt, to tell a retry from a duplicate (docs/retries.md), the credentials of
    its connection (execution/credentials.py) and, when its tenant signs its calls, the Standard
    Webhooks headers (execution/signing.py)."""
    request = HttpRequest(
        method=call.method,
        url=call.url,
        headers=call.headers,
        body=call.body,
        timeout_ms=call.timeout_ms,
        agent_headers={
            "X-Service-Call-Id": str(call.service_call_id),
            "X-Service-Call-Attempt": str(call.attempt),
        },
    )
    if credential is not None:
        request = with_credential(request, credential)
    return AttemptOrder(
        tenant_id=call.tenant_id,
        service_call_id=call.service_call_id,
        correlation_id=call.correlation_id,
        request=signed(request, tenant_id=call.tenant_id, msg_id=f"{call.service_call_id}.{call.attempt}", at=utcnow()),
        attempt=call.attempt,
        not_before=call.not_before.timestamp() if call.not_before else None,
    )


def start_and_claim(
    keys: Sequence[CallKey],
    *,
    worker_id: str,
    ahead: Collection[uuid.UUID] = (),
    ahead_until: datetime | None = None,
) -> list[Attempt]:
    """Start the due calls among `keys` (and those of `ahead` due by `ahead_until` that may start
    ahead: orchestration.services.service_calls_start) and claim their attempts, in one
    transaction.

    One transaction, not two: on SQLite each takes the single write lock, and the timer loop
    waits for it on the path from due time to startedAt. Either both commit or neither, so
    a call is never left Running without its attempt row by this step.
    """
    with transaction.atomic():
        started = service_calls_start(keys=keys, ahead=ahead, ahead_until=ahead_until)
        return claim(started, worker_id=worker_id)


def start_and_claim_overdue(
    *,
    due_before: datetime,
    limit: int,
    worker_id: str,
    exclude: Collection[uuid.UUID] = (),
    exclude_tenants: Collection[str] = (),
    take_slot: Callable[[str], bool] | None = None,
) -> list[Attempt]:
    """Start up to `limit` calls of the due backlog (oldest due first, the tenants taking turns
    for the threads `take_slot` gives them; but those in `exclude`) and claim their attempts,
    in one transaction, as start_and_claim does."""
    with transaction.atomic():
        started = service_calls_start_overdue(
            due_before=due_before, limit=limit, exclude=exclude, exclude_tenants=exclude_tenants, take_slot=take_slot
        )
        return claim(started, worker_id=worker_id)


def claim(started: Iterable[StartedCall], *, worker_id: str) -> list[Attempt]:
    started = list(started)
    # The connections the calls name, read now (one query): a change applies from the next attempt.
    credentials = credentials_for((call.tenant_id, call.connection) for call in started if call.connection)
    orders = [order_for(call, credentials.get((call.tenant_id, call.connection or ""))) for call in started]
    return attempts_begin(orders=orders, worker_id=worker_id)


def until_start(order: AttemptOrder) -> float:
    """How long the attempt waits for its start (seconds, 0 if none): started ahead by the timer
    (twice TIMER_LEAD_MS at most), or admitted a moment before its start by flow control's rate,
    it leaves at its start (docs/architecture.md, "Started ahead, sent on time")."""
    return max(0.0, order.not_before - time.time()) if order.not_before is not None else 0.0


def run_attempt(attempt: Attempt) -> Outcome:
    order = attempt.order
    pause = until_start(order)
    if pause:
        time.sleep(pause)
    with log_context(
        tenantId=order.tenant_id, serviceCallId=str(order.service_call_id), correlationId=order.correlation_id
    ):
        set_out = utcnow()
        outcome = replace(send(order.request), started_at=set_out)
        logger.info(
            "attempt finished",
            extra={
                "status": outcome.status,
                "errorKind": outcome.error_kind,
                "latencyMs": outcome.latency_ms,
            },
        )
    return outcome


def record(results: Sequence[tuple[Attempt, Outcome]]) -> None:
    """Write the attempt log and the calls' final states, in one transaction (one write lock)."""
    with transaction.atomic():
        attempts_finish(results=results)
        service_calls_finish(
            results=[
                (CallKey(attempt.order.tenant_id, attempt.order.service_call_id, attempt.order.attempt), outcome)
                for attempt, outcome in results
            ]
        )


def run_now(keys: Sequence[CallKey], *, worker_id: str) -> int:
    """Start, perform and finish the given calls in this thread; returns attempts made."""
    attempts = start_and_claim(keys, worker_id=worker_id)
    for attempt in attempts:
        record([(attempt, run_attempt(attempt))])
    return len(attempts)
