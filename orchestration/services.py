"""State transitions of service calls: the only code that writes service_calls and their tags.

Every transition is a conditional UPDATE inside one transaction with its outbox events, so a
duplicate message finds zero rows to change, and that is not an error (docs/architecture.md,
'The path of one call').
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from operator import itemgetter
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from core.db import PreparedInsert, group_commit, insert_prepare, insert_rows_prepare, rows_by_key, update_many
from core.errors import Conflict, NotFound, ValidationFailed
from core.fairness import round_robin
from core.ids import iso_ms, new_id, utcnow
from core.secrets import SecretUnavailable, is_sealed, redact_headers, rotate_sealed, seal_headers, unseal_headers
from execution.outcomes import ErrorKind, Outcome
from orchestration.admission import admit, held_since_cleared_on_cancel, release_held, starts_place
from orchestration.flow import target_host
from orchestration.models import FAVORITE_TAG, ServiceCall, ServiceCallTag
from orchestration.retries import (
    RetryPolicy,
    next_attempt_at,
    policy_capped,
    policy_ceiling_errors,
    should_retry,
)
from orchestration.selectors import service_calls_overdue, startable_due
from orchestration.validation import Submission, validate_encodable, validate_tags
from outbox.models import OutboxEvent
from outbox.services import NewEvent, PreparedEvents, outbox_append, outbox_prepare
from tenants.selectors import tenant_ceilings_get
from timer.selectors import calls_with_pending_timer
from timer.services import timer_rearm, timer_register, timers_discard

logger = logging.getLogger(__name__)

EVENT_BODY_SNIPPET = 1024
# The backlog's start with fair shares looks at this many times as many of the oldest due calls
# as it may start, so that a tenant with a long backlog does not hide the others' in one look.
FAIR_CANDIDATES = 4


@dataclass(frozen=True)
class CallKey:
    tenant_id: str
    service_call_id: uuid.UUID
    # For an outcome: the attempt it belongs to. A finish for any other attempt than the
    # call's current one changes nothing.
    attempt: int | None = None


@dataclass(frozen=True)
class StartedCall:
    """A call that just turned Running: what execution needs to perform its attempt."""

    tenant_id: str
    service_call_id: uuid.UUID
    correlation_id: str
    method: str
    url: str
    headers: dict[str, str]  # plaintext, for the wire only
    body: Any
    timeout_ms: int
    attempt: int = 1
    # Flow control's rate may admit a call a moment before it starts: not sent before then.
    not_before: datetime | None = None

    @property
    def key(self) -> CallKey:
        return CallKey(self.tenant_id, self.service_call_id, self.attempt)


def public_request_spec(spec: dict[str, Any], *, body_limit: int | None = None) -> dict[str, Any]:
    """The request spec as it may be shown: secret header values redacted."""
    body = spec.get("body")
    if body_limit is not None and body is not None:
        text = body if isinstance(body, str) else json.dumps(body)
        if len(text) > body_limit:
            body = text[:body_limit]
    return {
        "method": spec["method"],
        "url": spec["url"],
        "headers": redact_headers(spec.get("headers")),
        "body": body,
        "timeoutMs": spec.get("timeoutMs", settings.EXECUTION_TIMEOUT_MS),
    }


def _fingerprint(submission: Submission) -> str:
    # Keyed: the payload holds secret header values, which a bare hash would let anyone with
    # the database try to guess.
    canonical = json.dumps(submission.fingerprint_payload(), sort_keys=True, separators=(",", ":"))
    return hmac.new(settings.SECRET_KEY.encode(), canonical.encode(), hashlib.sha256).hexdigest()


def _event(
    call: ServiceCall, type_: str, payload: dict[str, Any], at: datetime, causation_id: str | None = None
) -> NewEvent:
    return NewEvent(
        tenant_id=call.tenant_id,
        aggregate_id=call.service_call_id,
        type=type_,
        payload={"serviceCallId": str(call.service_call_id), **payload},
        correlation_id=call.correlation_id,
        causation_id=causation_id,
        at=at,
    )


def service_call_submit(
    *,
    tenant_id: str,
    submission: Submission,
    correlation_id: str,
    rerun_of: uuid.UUID | None = None,
    sealed_headers: dict[str, Any] | None = None,
    occurrence: tuple[uuid.UUID, datetime] | None = None,
) -> tuple[ServiceCall, bool]:
    """Store a call as Scheduled with its tags, events and timer. Returns (call, created).

    A reused idempotency key with the same payload returns the existing call (created=False);
    with a different payload it raises Conflict. `occurrence` (schedule id, occurrence time)
    marks the call a schedule makes: an occurrence already made returns that call
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
                ServiceCall.objects.filter(tenant_id=tenant_id, schedule_id=occurrence[0], occurrence_at=occurrence[1])
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
    if not errors:
        return policy
    if cap:
        return policy_capped(policy, **bounds)
    raise ValidationFailed(errors)


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


def _new_call(
    *,
    tenant_id: str,
    submission: Submission,
    correlation_id: str,
    fingerprint: str,
    rerun_of: uuid.UUID | None,
    sealed_headers: dict[str, Any] | None,
    occurrence: tuple[uuid.UUID, datetime] | None,
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
        schedule_id=occurrence[0] if occurrence else None,
        occurrence_at=occurrence[1] if occurrence else None,
        target_host=target_host(submission.url),
    )
    events = outbox_prepare(
        events=[
            _event(
                call,
                OutboxEvent.Type.SUBMITTED,
                {
                    "name": call.name,
                    "requestSpec": public_request_spec(spec, body_limit=EVENT_BODY_SNIPPET),
                    "submittedAt": iso_ms(now),
                    "dueAt": iso_ms(due_at),
                    "tags": submission.tags,
                    **({"retryPolicy": call.retry_policy} if call.retry_policy else {}),
                    **({"scheduleId": str(occurrence[0]), "occurrenceAt": iso_ms(occurrence[1])} if occurrence else {}),
                    **({"rerunOf": str(rerun_of)} if rerun_of else {}),
                },
                now,
            ),
            _event(call, OutboxEvent.Type.SCHEDULED, {"dueAt": iso_ms(due_at)}, now),
        ]
    )
    return _NewCall(
        call=call,
        call_insert=insert_prepare([call]),
        tags_insert=insert_rows_prepare(
            ServiceCallTag,
            fields=("tenant", "service_call", "tag"),
            rows=[(tenant_id, call.service_call_id, tag) for tag in submission.tags],
        ),
        events=events,
        correlation_id=correlation_id,
        due_now=due_at <= now,
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
        transaction.on_commit(lambda: _enqueue_start(call.tenant_id, call.service_call_id))
    return call


def _enqueue_start(tenant_id: str, service_call_id: uuid.UUID) -> None:
    from django_q.tasks import async_task

    try:
        async_task("workers.tasks.run_due_call", tenant_id, str(service_call_id), q_options={"timeout": 150})
    except Exception:  # the durable timer still fires it; the enqueue is only a shortcut
        logger.warning(
            "could not enqueue immediate start",
            exc_info=True,
            extra={"tenantId": tenant_id, "serviceCallId": str(service_call_id)},
        )


def service_calls_start(*, keys: Sequence[CallKey]) -> list[StartedCall]:
    """Scheduled -> Running for the given calls that are due; others are left alone. A call
    over its tenant's flow-control limits stays Scheduled, held (docs/flow-control.md)."""
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
            where={"status": ServiceCall.Status.SCHEDULED, "due_at__lte": now},
            skip_locked=True,
        )
        rows = [row for row in rows if wanted[row.service_call_id] == row.tenant_id]
        return _start_rows(rows, now=now)


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
)


def _start_rows(rows: list[ServiceCall], *, now: datetime) -> list[StartedCall]:
    """Scheduled -> Running for these locked rows (inside the caller's transaction)."""
    rows, now, later = admit(rows, now=now)
    if not rows:
        return []
    held_ms = release_held(rows, now=now)
    # The rows are locked (or SQLite's write lock is held): each one's attempt count is current.
    updated = update_many(
        ServiceCall,
        set_fields=("attempts",),
        where_fields=("service_call_id",),
        rows=[(row.attempts + 1, row.pk) for row in rows],
        set_constants={"status": ServiceCall.Status.RUNNING, "started_at": now},
        where_extra={"status": ServiceCall.Status.SCHEDULED},
    )
    if updated != len(rows):  # cannot happen under the row locks / SQLite write lock
        raise RuntimeError("start raced with another writer")
    starts_place(later)
    outbox_append(
        events=[
            _event(
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
            .values_list("service_call_id", "correlation_id", "attempts", "retry_policy")
        }
        rows, events, retries = [], [], []
        for key, outcome in results:
            found = running.pop(key.service_call_id, None)  # pop: a duplicate counts once
            if found is None:
                continue
            correlation_id, attempt, policy = found
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
            events.append(_event(call, type_, {"finishedAt": iso_ms(now), "attempt": attempt, **meta}, now))
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
                _event(
                    call,
                    OutboxEvent.Type.RETRY_SCHEDULED,
                    {"attempt": attempt, "nextAttemptAt": iso_ms(due_at), "lastError": meta.get("errorMeta")},
                    now,
                )
            )
        if events:
            outbox_append(events=events)
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
        transaction.on_commit(lambda: _enqueue_start(call.tenant_id, call.service_call_id))


def service_call_finish(*, tenant_id: str, service_call_id: uuid.UUID, outcome: Outcome) -> bool:
    return service_calls_finish(results=[(CallKey(tenant_id, service_call_id), outcome)]) == 1


def service_call_interrupt(*, tenant_id: str, service_call_id: uuid.UUID, reason: str) -> bool:
    """Finish a Running call whose request may have been sent: never send it again."""
    outcome = Outcome.failure(ErrorKind.INTERRUPTED, reason)
    return service_call_finish(tenant_id=tenant_id, service_call_id=service_call_id, outcome=outcome)


def service_call_cancel(
    *, tenant_id: str, service_call_id: uuid.UUID | str, correlation_id: str | None = None
) -> ServiceCall:
    """Scheduled -> Cancelled: the call never starts, its timer is discarded. Cancelling a
    Cancelled call changes nothing; a Running or finished call raises Conflict naming its status.

    The conditional update races the timer's start fairly: whichever commits first wins, and
    the other finds the call no longer Scheduled (docs/retries.md, 'Cancel').
    """
    with transaction.atomic():
        call = _get(tenant_id, service_call_id)
        now = utcnow()
        changed = ServiceCall.objects.filter(
            pk=call.service_call_id, tenant_id=tenant_id, status=ServiceCall.Status.SCHEDULED
        ).update(status=ServiceCall.Status.CANCELLED, finished_at=now, **held_since_cleared_on_cancel(call, now=now))
        call.refresh_from_db()
        if not changed:
            if call.status == ServiceCall.Status.CANCELLED:
                return call
            raise Conflict(
                f"Service call {call.service_call_id} is {call.status}; only a Scheduled call can be cancelled."
            )
        timers_discard(keys=[(tenant_id, call.service_call_id)])
        outbox_append(
            events=[
                _event(
                    call,
                    OutboxEvent.Type.CANCELLED,
                    {"cancelledAt": iso_ms(now), "attempt": call.attempts},
                    now,
                    causation_id=correlation_id,
                )
            ]
        )
    return call


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


def _get(tenant_id: str, service_call_id: uuid.UUID | str) -> ServiceCall:
    call = ServiceCall.objects.filter(tenant_id=tenant_id, pk=service_call_id).first()
    if call is None:
        raise NotFound(f"Service call {service_call_id} not found.")
    return call


def service_call_tags_set(
    *,
    tenant_id: str,
    service_call_id: uuid.UUID | str,
    tags: list[str],
    keep_favorite: bool = False,
    correlation_id: str | None = None,
) -> ServiceCall:
    """Replace the tag set; appends ServiceCallTagged when anything changed. With
    `keep_favorite` the star (tag `favorite`) stays as it is, whatever `tags` holds: the
    dashboard's tag editor shows the star apart from the other tags."""
    if keep_favorite:
        tags = [tag for tag in tags if tag != FAVORITE_TAG]
    tags = validate_tags(tags)
    with transaction.atomic():
        call = _get(tenant_id, service_call_id)
        current = set(
            ServiceCallTag.objects.filter(tenant_id=tenant_id, service_call=call).values_list("tag", flat=True)
        )
        if keep_favorite and FAVORITE_TAG in current:
            tags = validate_tags([*tags, FAVORITE_TAG])  # the star counts toward the limit
        added = [tag for tag in tags if tag not in current]
        removed = sorted(current - set(tags))
        if not added and not removed:
            return call
        ServiceCallTag.objects.filter(tenant_id=tenant_id, service_call=call, tag__in=removed).delete()
        ServiceCallTag.objects.bulk_create(
            [ServiceCallTag(tenant_id=tenant_id, service_call=call, tag=tag) for tag in added]
        )
        now = utcnow()
        outbox_append(
            events=[
                _event(
                    call,
                    OutboxEvent.Type.TAGGED,
                    {"tags": tags, "added": added, "removed": removed},
                    now,
                    causation_id=correlation_id,
                ),
            ]
        )
    return call


def service_call_favorite_set(
    *, tenant_id: str, service_call_id: uuid.UUID | str, favorite: bool, correlation_id: str | None = None
) -> ServiceCall:
    """Star or unstar: the star is the reserved tag `favorite`."""
    current = list(
        ServiceCallTag.objects.filter(tenant_id=tenant_id, service_call_id=service_call_id)
        .order_by("id")
        .values_list("tag", flat=True)
    )
    if not ServiceCall.objects.filter(tenant_id=tenant_id, pk=service_call_id).exists():
        raise NotFound(f"Service call {service_call_id} not found.")
    tags = [tag for tag in current if tag != FAVORITE_TAG] + ([FAVORITE_TAG] if favorite else [])
    return service_call_tags_set(
        tenant_id=tenant_id, service_call_id=service_call_id, tags=tags, correlation_id=correlation_id
    )


def service_call_rerun(
    *, tenant_id: str, service_call_id: uuid.UUID | str, correlation_id: str, due_at: datetime | None = None
) -> ServiceCall:
    """Submit a new call with the same request and retry policy (new id), due at `due_at` (checked by the edge,
    orchestration.validation.validate_rerun; None or past: now); ValidationFailed if the stored
    request holds what validation now refuses."""
    original = _get(tenant_id, service_call_id)
    spec = original.request_spec
    tags = list(
        ServiceCallTag.objects.filter(tenant_id=tenant_id, service_call=original)
        .exclude(tag=FAVORITE_TAG)
        .order_by("id")
        .values_list("tag", flat=True)
    )
    # A row stored before the rules of docs/security.md §1 may hold what they refuse now (a
    # lone surrogate, a NUL, a body nested too deep): a copy is refused as a new call would be.
    validate_encodable({"name": original.name, "requestSpec": spec, "tags": tags})
    submission = Submission(
        name=original.name,
        method=spec["method"],
        url=spec["url"],
        headers={name: "" for name in spec.get("headers") or {}},  # sealed values copied below
        body=spec.get("body"),
        timeout_ms=spec.get("timeoutMs", settings.EXECUTION_TIMEOUT_MS),
        due_at=due_at,
        tags=tags,
        idempotency_key=None,
        # The same policy: a rerun is the same call made again (docs/retries.md).
        retry_policy=RetryPolicy.from_wire(original.retry_policy) if original.retry_policy else None,
    )
    call, _ = service_call_submit(
        tenant_id=tenant_id,
        submission=submission,
        correlation_id=correlation_id,
        rerun_of=original.service_call_id,
        sealed_headers=dict(spec.get("headers") or {}),
    )
    return call


# --- Secrets at rest: key rotation (docs/security.md §4) ---------------------------------


@dataclass
class RotationResult:
    examined: int = 0
    rotated: int = 0
    failed: list[str] | None = None


def _batches(batch_size: int) -> Iterator[list[tuple[Any, dict]]]:
    last = None
    while True:
        rows = ServiceCall.objects.order_by("service_call_id")
        if last is not None:
            rows = rows.filter(service_call_id__gt=last)
        batch = list(rows.values_list("service_call_id", "request_spec")[:batch_size])
        if not batch:
            return
        last = batch[-1][0]
        yield batch


def sealed_values_rotate(*, batch_size: int = 500, dry_run: bool = False) -> RotationResult:
    """Re-encrypt every sealed header value of every call under the first key, in batches
    (each batch one transaction, each row a conditional update on its old spec). A row
    sealed under a key no longer configured is reported in `failed` and left as it is."""
    result = RotationResult(failed=[])
    for batch in _batches(batch_size):
        updates = []
        for service_call_id, spec in batch:
            result.examined += 1
            headers = (spec or {}).get("headers") or {}
            if not any(is_sealed(value) for value in headers.values()):
                continue
            try:
                rotated = rotate_sealed(headers)
            except SecretUnavailable:
                result.failed.append(str(service_call_id))  # type: ignore[union-attr]
                continue
            if rotated != headers:
                updates.append((service_call_id, spec, {**spec, "headers": rotated}))
        if dry_run or not updates:
            result.rotated += len(updates)
            continue
        with transaction.atomic():
            for service_call_id, old_spec, new_spec in updates:
                current = (
                    ServiceCall.objects.select_for_update()
                    .filter(pk=service_call_id)
                    .values_list("request_spec", flat=True)
                    .first()
                )
                if current != old_spec:  # changed meanwhile (a rerun copies, never edits): skip
                    continue
                result.rotated += ServiceCall.objects.filter(pk=service_call_id).update(request_spec=new_spec)
    return result
