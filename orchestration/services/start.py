"""Start: Scheduled -> Running for due calls flow control admits, by key (the timer's starts) or
the oldest due (the backlog's); a skipped start's timer armed again (docs/architecture.md,
"Every worker process executes").
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import datetime
from operator import itemgetter

from django.conf import settings
from django.db import transaction

from core.db import rows_by_key, update_many
from core.fairness import round_robin
from core.ids import iso_ms, utcnow
from core.secrets import SecretUnavailable, unseal_headers
from execution.outcomes import ErrorKind, Outcome
from orchestration.admission import admit, release_held, tenant_has_limits
from orchestration.models import ServiceCall
from orchestration.selectors import service_calls_overdue, startable_due
from orchestration.services.calls import CallKey, StartedCall, call_event
from orchestration.services.finish import service_calls_finish
from orchestration.services.overlap import overlap_decide
from outbox.models import OutboxEvent
from outbox.services import outbox_append
from timer.selectors import calls_with_pending_timer
from timer.services import timer_rearm

logger = logging.getLogger(__name__)


# The backlog's start with fair shares looks at this many times as many of the oldest due calls
# as it may start, so that a tenant with a long backlog does not hide the others' in one look.
FAIR_CANDIDATES = 4


def service_calls_start(
    *, keys: Sequence[CallKey], ahead: Collection[uuid.UUID] = (), ahead_until: datetime | None = None
) -> list[StartedCall]:
    """Scheduled -> Running for the given calls that are due; others are left alone. A call
    over its tenant's flow-control limits stays Scheduled, held (docs/flow-control.md).

    Those in `ahead` (their timers fired ahead) start only if due by `ahead_until` and they may
    start ahead: Running now, their `startedAt` and their request's departure at their due time
    (docs/architecture.md, "Started ahead, sent on time"). Not a call of a tenant with
    flow-control limits, nor a schedule's call: their rules (flow control's, the overlap
    policy's, a pause's) are decided when they are due."""
    if not keys:
        return []
    wanted = {key.service_call_id: key.tenant_id for key in keys}
    # No savepoint when nested (a failure rolls back the caller's whole transaction, as every
    # caller wants): a SAVEPOINT and its RELEASE are two more statements under the write lock.
    with transaction.atomic(savepoint=False):
        now = utcnow()
        rows = rows_by_key(
            ServiceCall,
            keys=list(wanted),
            fields=_START_FIELDS,
            where={
                "status": ServiceCall.Status.SCHEDULED,
                "due_at__lte": max(now, ahead_until or now) if ahead else now,
            },
            skip_locked=True,
        )
        rows = [
            row
            for row in rows
            if wanted[row.service_call_id] == row.tenant_id
            and (_starts_ahead(row) if row.service_call_id in ahead else row.due_at <= now)
        ]
        return _start_rows(rows, now=now)


def _starts_ahead(row: ServiceCall) -> bool:
    return row.schedule_id is None and not tenant_has_limits(row.tenant_id)


def service_calls_start_overdue(
    *,
    due_before: datetime,
    limit: int,
    exclude: Collection[uuid.UUID] = (),
    exclude_tenants: Collection[str] = (),
    take_slot: Callable[[str], bool] | None = None,
) -> list[StartedCall]:
    """Start up to `limit` Scheduled calls due before `due_before`, oldest due first, that flow
    control does not hold (its flow loop starts those): the due backlog a timer did not start
    in time, or left for whichever worker has room (docs/architecture.md, "Every worker
    process executes"). Chosen inside the start's transaction (under SQLite's write lock, or
    skipping rows another worker has locked on PostgreSQL), so two workers never pick the same
    call. `exclude`: calls the caller has set aside (their start failed).

    With `take_slot` (the worker's fair shares, docs/flow-control.md), the tenants take turns:
    of the oldest due calls (a few per place, none of `exclude_tenants`), each tenant's first,
    then each one's second..., as long as `take_slot(tenant_id)` gives it a thread."""
    if limit <= 0:
        return []
    # No savepoint when nested (a failure rolls back the caller's whole transaction, as every
    # caller wants): a SAVEPOINT and its RELEASE are two more statements under the write lock.
    with transaction.atomic(savepoint=False):
        now = utcnow()
        candidates = service_calls_overdue(
            due_before=min(now, due_before),
            limit=limit if take_slot is None else limit * FAIR_CANDIDATES,
            exclude=exclude,
            exclude_tenants=exclude_tenants,
            lock=True,
        )
        if take_slot is not None:
            candidates = [c for c in round_robin(candidates, key=itemgetter(0)) if take_slot(c[0])][:limit]
        keys = [pk for _, pk in candidates]
        # Locked above (or under SQLite's write lock): read by key, in due order.
        rows = {row.service_call_id: row for row in rows_by_key(ServiceCall, keys=keys, fields=_START_FIELDS)}
        return _start_rows([rows[pk] for pk in keys if pk in rows], now=now)


# The fields a start reads.
_START_FIELDS = (
    "service_call_id",
    "tenant_id",
    "correlation_id",
    "request_spec",
    "attempts",
    "due_at",
    "target_host",
    "held_since",
    "held_queue",
    "held_ms",
    "schedule_id",
    "occurrence_at",
    "overlap",
    "overlap_state",
)


def _start_rows(rows: list[ServiceCall], *, now: datetime) -> list[StartedCall]:
    """Scheduled -> Running for these locked rows (inside the caller's transaction): those a
    schedule's overlap policy lets start, and then flow control. A row not due yet (started
    ahead) or admitted a moment before its rate lets it start has that instant as its start:
    its `startedAt`, and when its request leaves."""
    rows = overlap_decide(rows, now=now)
    rows, now, later = admit(rows, now=now)
    if not rows:
        return []
    for row in rows:
        if row.due_at > later.get(row.pk, now):
            later[row.pk] = row.due_at
    held_ms = release_held(rows, now=now)
    # The rows are locked (or SQLite's write lock is held): each one's attempt count is current.
    updated = update_many(
        ServiceCall,
        set_fields=("attempts", "started_at"),
        where_fields=("service_call_id",),
        rows=[(row.attempts + 1, later.get(row.pk, now), row.pk) for row in rows],
        set_constants={"status": ServiceCall.Status.RUNNING},
        where_extra={"status": ServiceCall.Status.SCHEDULED},
    )
    if updated != len(rows):  # cannot happen under the row locks / SQLite write lock
        raise RuntimeError("start raced with another writer")
    outbox_append(
        events=[
            call_event(
                row,
                OutboxEvent.Type.RUNNING,
                {
                    "startedAt": iso_ms(later.get(row.pk, now)),
                    "attempt": row.attempts + 1,
                    **({"heldMs": held_ms[row.pk]} if held_ms.get(row.pk) else {}),
                },
                now,
            )
            for row in rows
        ]
    )
    started, unreadable = [], []
    for row in rows:
        attempt = row.attempts + 1
        try:
            started.append(replace(_started(row, attempt=attempt), not_before=later.get(row.pk)))
        except SecretUnavailable as exc:
            unreadable.append((CallKey(row.tenant_id, row.service_call_id, attempt), _unreadable_outcome(exc)))
    # A sealed header no configured key opens: fail now rather than leave it for the watchdog.
    service_calls_finish(results=unreadable)
    return started


def _unreadable_outcome(exc: SecretUnavailable) -> Outcome:
    return Outcome.failure(ErrorKind.INTERNAL_ERROR, f"{exc} (nothing was sent)")


def service_call_start(*, tenant_id: str, service_call_id: uuid.UUID) -> StartedCall | None:
    started = service_calls_start(keys=[CallKey(tenant_id, service_call_id)])
    return started[0] if started else None


def _started(row: ServiceCall, *, attempt: int) -> StartedCall:
    spec = row.request_spec
    return StartedCall(
        tenant_id=row.tenant_id,
        service_call_id=row.service_call_id,
        correlation_id=row.correlation_id,
        method=spec["method"],
        url=spec["url"],
        headers=unseal_headers(spec.get("headers") or {}),
        body=spec.get("body"),
        timeout_ms=spec.get("timeoutMs", settings.EXECUTION_TIMEOUT_MS),
        attempt=attempt,
        connection=spec.get("connection"),
    )


def running_call_for_execution(*, tenant_id: str, service_call_id: uuid.UUID) -> StartedCall | None:
    """A Running call's request (its current attempt), for a worker that executes it after a crash."""
    row = (
        ServiceCall.objects.filter(tenant_id=tenant_id, pk=service_call_id, status=ServiceCall.Status.RUNNING)
        .only("service_call_id", "tenant_id", "correlation_id", "request_spec", "attempts")
        .first()
    )
    if row is None:
        return None
    try:
        return _started(row, attempt=row.attempts)
    except SecretUnavailable as exc:
        service_calls_finish(results=[(CallKey(tenant_id, service_call_id, row.attempts), _unreadable_outcome(exc))])
        return None


def service_calls_rearm_overdue(*, due_before: datetime, limit: int = 500) -> int:
    """Arm the timer again of Scheduled calls overdue since before `due_before` that have none
    pending; returns how many. A start skips a call whose row another transaction holds
    locked (SKIP LOCKED, so two clusters never wait on each other); if that holder rolled
    back, the fired timer would leave the call Scheduled for ever without this sweep."""
    overdue = list(
        # A held call waits for flow control, its timer Reached on purpose: the flow loop starts it.
        startable_due(due_before)
        .filter(due_at__lt=due_before)
        .order_by("due_at")
        .values_list("service_call_id", "tenant_id", "due_at", "correlation_id")[:limit]
    )
    if not overdue:
        return 0
    pending = calls_with_pending_timer(service_call_ids=[row[0] for row in overdue])
    stuck = [row for row in overdue if row[0] not in pending]
    for service_call_id, tenant_id, due_at, correlation_id in stuck:
        timer_rearm(tenant_id=tenant_id, service_call_id=service_call_id, due_at=due_at, correlation_id=correlation_id)
    if stuck:
        logger.warning("armed the timers of %d overdue Scheduled calls again", len(stuck))
    return len(stuck)
