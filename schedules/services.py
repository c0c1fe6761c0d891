"""Writes of schedules, and the loop that makes their occurrences into service calls
(docs/schedules.md). The only code that writes the `schedules` table; calls are made and
cancelled through orchestration's services, never written here.

Each occurrence becomes one ordinary call (`Scheduled`, due at the occurrence, fired by the
timer), made **ahead**: as one call comes due, the loop makes the next one. The call carries
`(schedule_id, occurrence_at)`, unique in the database, so however many loops (clusters) race,
an occurrence makes one call; the schedule row's own update is conditional on the revision the
loop planned from, under its row lock.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from core.db.wakeups import Channel, notify
from core.errors import Conflict, NotFound, ValidationFailed
from core.ids import iso_ms, new_id, utcnow
from core.secrets import SecretUnavailable, is_sealed, rotate_sealed, seal_headers
from execution.connections import connection_check
from orchestration.models import ServiceCall
from orchestration.retries import RetryPolicy
from orchestration.services import (
    RotationResult,
    retry_policy_within_ceilings,
    service_call_cancel,
    service_call_submit,
)
from orchestration.validation import Submission
from outbox.models import OutboxEvent
from outbox.services import NewEvent, outbox_append
from schedules.cron import jitter_of, next_occurrences, occurrences
from schedules.models import Schedule
from schedules.selectors import occurrence_call, waiting_calls
from schedules.validation import DEFAULT_CATCHUP_WINDOW_S, ScheduleInput, check_plan
from tenants.models import Tenant

logger = logging.getLogger("serviceagent.schedules")

# Missed occurrences run at most this many in a round (the latest within the catch-up window);
# older ones are skipped.
CATCHUP_MAX = 1000
# Skipped occurrences raised as events in a round, at most (the latest); the others are counted.
SKIPPED_EVENTS_MAX = 1000
# Why an occurrence was skipped (the event's `reason`, the count's key).
CATCHUP_REASON = "catchupWindow"
# Schedules advanced per pass of the loop, at most.
BATCH = 100
# Occurrences tried in a row when each one already had a call, cancelled (by a pause or a
# change before it came due): an occurrence makes one call, ever. Past this, the loop takes
# the schedule up again when the last one tried comes due.
MAX_TAKEN_IN_A_ROW = 10


# --- Making and cancelling calls ------------------------------------------------------------


def _submission(schedule: Schedule, at: datetime) -> tuple[Submission, dict[str, Any]]:
    """The call of one occurrence, and its header values as stored (sealed)."""
    spec = schedule.request_spec
    headers = dict(spec.get("headers") or {})
    submission = Submission(
        name=schedule.name,
        method=spec["method"],
        url=spec["url"],
        headers={name: "" for name in headers},  # the sealed values go as they are, below
        body=spec.get("body"),
        timeout_ms=spec.get("timeoutMs", settings.EXECUTION_TIMEOUT_MS),
        due_at=at + jitter_of(schedule.schedule_id, at, schedule.jitter_ms),
        tags=list(schedule.tags or []),
        idempotency_key=None,
        retry_policy=RetryPolicy.from_wire(schedule.retry_policy) if schedule.retry_policy else None,
        connection=spec.get("connection"),
    )
    return submission, headers


def _make(schedule: Schedule, at: datetime) -> ServiceCall:
    """The call of the occurrence `at`: made now, or the one already made (by another loop)."""
    submission, sealed = _submission(schedule, at)
    call, _ = service_call_submit(
        tenant_id=schedule.tenant_id,
        submission=submission,
        # Every call of a schedule correlates with the schedule (logs, events).
        correlation_id=str(schedule.schedule_id),
        sealed_headers=sealed,
        occurrence=(schedule.schedule_id, at),
    )
    return call


def _make_next(schedule: Schedule, *, after: datetime) -> datetime | None:
    """Make the first occurrence after `after` that can still make a call; returns it (None:
    the schedule has no more occurrences)."""
    tried = None
    for taken, at in enumerate(
        occurrences(schedule.cron, schedule.timezone, after=after, start_at=schedule.start_at, end_at=schedule.end_at)
    ):
        call = _make(schedule, at)
        if call.status != ServiceCall.Status.CANCELLED:
            return at
        # This occurrence already made its call, and it was cancelled: an occurrence makes one
        # call (service_calls_schedule_occurrence), so the schedule goes on with the next one.
        tried = at
        if taken + 1 >= MAX_TAKEN_IN_A_ROW:
            break
    return tried


def _cancel(calls: Iterable[ServiceCall], correlation_id: str | None) -> int:
    """Cancel calls that wait; one the timer started meanwhile is left to run (Conflict)."""
    cancelled = 0
    for call in calls:
        try:
            service_call_cancel(
                tenant_id=call.tenant_id, service_call_id=call.service_call_id, correlation_id=correlation_id
            )
            cancelled += 1
        except (Conflict, NotFound):
            pass
    return cancelled


def _replan(schedule: Schedule, *, now: datetime, correlation_id: str | None, call_changed: bool) -> None:
    """Plan the schedule from `now` again: what waits is cancelled and the first occurrence
    from now on is made. A waiting call for that very occurrence is kept when nothing that
    goes into a call changed (a new end, a new start that does not move it)."""
    waiting = waiting_calls(tenant_id=schedule.tenant_id, schedule_id=schedule.schedule_id, lock=True)
    if schedule.paused:
        _cancel(waiting, correlation_id)
        schedule.advance_at = None
        return
    first = next_occurrences(
        schedule.cron, schedule.timezone, after=now, count=1, start_at=schedule.start_at, end_at=schedule.end_at
    )
    keep = None
    if first and not call_changed:
        keep = next((call for call in waiting if call.occurrence_at == first[0]), None)
    _cancel([call for call in waiting if call is not keep], correlation_id)
    made = keep.occurrence_at if keep is not None else _make_next(schedule, after=now)
    if made is not None:
        schedule.last_occurrence_at = made
    schedule.advance_at = made
    notify(Channel.SCHEDULES)  # the schedules loop sleeps until the next advance it knew of


# --- A tenant's schedules ---------------------------------------------------------------------


def _spec_sealed(spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "headers": seal_headers(spec.get("headers") or {})}


def _check_connection(tenant_id: str, spec: dict[str, Any] | None) -> None:
    """The connection the schedule's calls will carry exists, and the request leaves its header
    alone (docs/connections.md)."""
    spec = spec or {}
    connection_check(
        tenant_id=tenant_id,
        name=spec.get("connection"),
        header_names=spec.get("headers") or {},
        field="requestSpec.connection",
    )


def _locked(tenant_id: str, schedule_id: uuid.UUID | str) -> Schedule:
    try:
        pk = schedule_id if isinstance(schedule_id, uuid.UUID) else uuid.UUID(str(schedule_id))
    except ValueError:
        raise NotFound(f"Schedule {schedule_id} not found.") from None
    schedule = Schedule.objects.select_for_update().filter(tenant_id=tenant_id, pk=pk).first()
    if schedule is None:
        raise NotFound(f"Schedule {schedule_id} not found.")
    return schedule


def schedule_create(
    *, tenant_id: str, data: ScheduleInput, correlation_id: str | None = None, now: datetime | None = None
) -> Schedule:
    """Store a schedule (checked by validate_schedule) and make its first call at once, in the
    same transaction, unless it is paused. A tenant has at most MAX_SCHEDULES_PER_TENANT, and
    its retry policy keeps within the tenant's ceilings (docs/retries.md, "Operator ceilings")."""
    now = now or utcnow()
    if data.retry_policy is not None:
        retry_policy_within_ceilings(tenant_id=tenant_id, policy=data.retry_policy)
    _check_connection(tenant_id, data.request_spec)
    with transaction.atomic():
        # The tenant's row, locked: two creates never both take the last place.
        list(Tenant.objects.select_for_update().filter(pk=tenant_id).values_list("pk", flat=True))
        limit = settings.MAX_SCHEDULES_PER_TENANT
        if Schedule.objects.filter(tenant_id=tenant_id).count() >= limit:
            raise ValidationFailed(
                {"body": [f"A tenant may have at most {limit} schedules (MAX_SCHEDULES_PER_TENANT)."]}
            )
        schedule = Schedule.objects.create(
            schedule_id=new_id(),
            tenant_id=tenant_id,
            name=data.name,
            cron=data.cron,
            timezone=data.timezone or "UTC",
            request_spec=_spec_sealed(data.request_spec or {}),
            tags=list(data.tags or []),
            retry_policy=data.retry_policy.as_wire() if data.retry_policy else None,
            start_at=data.start_at,
            end_at=data.end_at,
            paused=bool(data.paused),
            paused_note=(data.paused_note or "") if data.paused else "",
            catchup_window_s=data.catchup_window_s if data.catchup_window_s is not None else DEFAULT_CATCHUP_WINDOW_S,
            jitter_ms=data.jitter_ms or 0,
            created_at=now,
            updated_at=now,
        )
        _replan(schedule, now=now, correlation_id=correlation_id, call_changed=True)
        schedule.save(update_fields=["last_occurrence_at", "advance_at"])
    return schedule


def schedule_update(
    *,
    tenant_id: str,
    schedule_id: uuid.UUID | str,
    data: ScheduleInput,
    correlation_id: str | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Change what `data` gives (validate_schedule(partial=True)). Pausing cancels the call
    made ahead; resuming, or a new cron, zone, start, end, request, tags or retry policy,
    plans the schedule from now again (_replan). A new name shows on the calls made after."""
    now = now or utcnow()
    given = data.given
    if "retryPolicy" in given and data.retry_policy is not None:
        retry_policy_within_ceilings(tenant_id=tenant_id, policy=data.retry_policy)
    if "requestSpec" in given:
        _check_connection(tenant_id, data.request_spec)
    with transaction.atomic():
        schedule = _locked(tenant_id, schedule_id)
        was_paused = schedule.paused
        before = (schedule.cron, schedule.timezone, schedule.start_at, schedule.end_at)
        calls_before = (schedule.tags, schedule.retry_policy)
        if "name" in given:
            schedule.name = data.name
        if "cron" in given:
            schedule.cron = data.cron
        if "timezone" in given:
            schedule.timezone = data.timezone or "UTC"
        if "startAt" in given:
            schedule.start_at = data.start_at
        if "endAt" in given:
            schedule.end_at = data.end_at
        if "requestSpec" in given:
            schedule.request_spec = _spec_sealed(data.request_spec or {})
        if "tags" in given:
            schedule.tags = list(data.tags or [])
        if "retryPolicy" in given:
            schedule.retry_policy = data.retry_policy.as_wire() if data.retry_policy else None
        if "paused" in given:
            schedule.paused = bool(data.paused)
        if "pausedNote" in given:
            if data.paused_note and not schedule.paused:
                raise ValidationFailed({"pausedNote": ["A note says why a schedule is paused: pause it too."]})
            schedule.paused_note = data.paused_note or ""
        if not schedule.paused:  # a note says why it is paused: a resume clears it
            schedule.paused_note = ""
        if "catchupWindow" in given:
            schedule.catchup_window_s = data.catchup_window_s
        if "jitterMs" in given:
            schedule.jitter_ms = data.jitter_ms
        time_changed = (schedule.cron, schedule.timezone, schedule.start_at, schedule.end_at) != before
        if time_changed:
            check_plan(
                cron=schedule.cron, zone=schedule.timezone, start_at=schedule.start_at, end_at=schedule.end_at, now=now
            )
        call_changed = (
            "requestSpec" in given or "jitterMs" in given or (schedule.tags, schedule.retry_policy) != calls_before
        )
        if schedule.paused != was_paused or time_changed or call_changed:
            _replan(schedule, now=now, correlation_id=correlation_id, call_changed=call_changed)
        schedule.updated_at = now
        schedule.revision += 1
        schedule.save()
    return schedule


def schedule_set_paused(
    *,
    tenant_id: str,
    schedule_id: uuid.UUID | str,
    paused: bool,
    correlation_id: str | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Pause (nothing more runs: the call made ahead is cancelled) or resume (planned from now;
    a pause's note goes)."""
    return schedule_update(
        tenant_id=tenant_id,
        schedule_id=schedule_id,
        data=ScheduleInput(given=frozenset({"paused"}), paused=paused),
        correlation_id=correlation_id,
        now=now,
    )


def schedule_delete(*, tenant_id: str, schedule_id: uuid.UUID | str, correlation_id: str | None = None) -> None:
    """Delete it: the call made ahead is cancelled, no occurrence follows; the calls it made stay."""
    with transaction.atomic():
        schedule = _locked(tenant_id, schedule_id)
        _cancel(
            waiting_calls(tenant_id=tenant_id, schedule_id=schedule.schedule_id, lock=True),
            correlation_id,
        )
        schedule.delete()


# --- The loop: one round per schedule whose call made ahead came due ---------------------


@dataclass
class MaterializePass:
    """What one pass did: schedules advanced, and those whose round failed (logged)."""

    advanced: int = 0
    failed: list[uuid.UUID] = field(default_factory=list)

    @property
    def handled(self) -> int:
        return self.advanced + len(self.failed)


def schedules_materialize(
    *,
    now: datetime | None = None,
    limit: int = BATCH,
    write_guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    set_aside: Collection[uuid.UUID] = (),
) -> MaterializePass:
    """Make the next call of every schedule whose call made ahead came due (advance_at <= now),
    at most `limit` of them, each in its own transaction under `write_guard`. Missed
    occurrences are settled on the way (_round). `set_aside`: schedules a previous pass failed
    on, left out for a while by the caller (never retried in a tight loop)."""
    now = now or utcnow()
    due = Schedule.objects.filter(advance_at__lte=now).order_by("advance_at")
    if set_aside:
        due = due.exclude(pk__in=list(set_aside))
    result = MaterializePass()
    for snapshot in due[:limit]:
        try:
            # Outside the transaction: after a long stop, listing a minutely schedule's missed
            # occurrences takes a while, and no lock need wait for it.
            missed = _missed(snapshot, now=now)
            with write_guard(), transaction.atomic():
                result.advanced += _round(snapshot, now=now, missed=missed)
        except Exception:
            logger.exception(
                "a schedule's round failed; it is set aside for a while",
                extra={"tenantId": snapshot.tenant_id, "correlationId": str(snapshot.schedule_id)},
            )
            result.failed.append(snapshot.schedule_id)
    return result


@dataclass
class Missed:
    """The occurrences after the call made ahead and no later than now (none unless the loop
    fell behind: the workers were stopped): those within the catch-up window, which run (the
    latest CATCHUP_MAX of them, oldest first), and those older, skipped."""

    within: list[datetime] = field(default_factory=list)
    older: int = 0
    # The instants of the older ones, for their events: the latest SKIPPED_EVENTS_MAX.
    older_shown: list[datetime] = field(default_factory=list)


def _missed(schedule: Schedule, *, now: datetime) -> Missed:
    until = min(now, schedule.end_at) if schedule.end_at else now
    window_start = now - timedelta(seconds=schedule.catchup_window_s)
    found = Missed()
    for at in occurrences(schedule.cron, schedule.timezone, after=schedule.advance_at, end_at=until):
        if at >= window_start:
            found.within.append(at)
        else:
            found.older += 1
            found.older_shown.append(at)
            del found.older_shown[:-SKIPPED_EVENTS_MAX]
    return found


def _round(snapshot: Schedule, *, now: datetime, missed: Missed) -> int:
    """Advance one schedule past its call made ahead (x0, due now) and make the next occurrence
    ahead. When the workers were stopped, occurrences passed meanwhile: those within the
    schedule's catch-up window run once each, oldest first; older ones are skipped, each counted
    and raised as a ScheduleOccurrenceSkipped event (docs/schedules.md, "Missed occurrences").
    Returns 1, or 0 if another loop or a user's change got there first."""
    # skip_locked: another cluster's loop holding it is advancing it; the revision says
    # whether anything changed since `snapshot` was read (then the next pass plans afresh).
    schedule = (
        Schedule.objects.select_for_update(skip_locked=True)
        .filter(pk=snapshot.pk, revision=snapshot.revision, advance_at=snapshot.advance_at)
        .first()
    )
    if schedule is None:
        return 0
    x0 = schedule.advance_at
    window_start = now - timedelta(seconds=schedule.catchup_window_s)
    skipped: list[datetime] = []
    if x0 < window_start and _cancelled_missed(schedule, x0):
        skipped.append(x0)
    runs = missed.within[-CATCHUP_MAX:]
    beyond = missed.within[: len(missed.within) - len(runs)]
    for at in runs:  # oldest first: each one due now, started in due order
        _make(schedule, at)
        schedule.last_occurrence_at = at
    older = [*missed.older_shown, *beyond]
    unshown = missed.older - len(missed.older_shown)
    made = _make_next(schedule, after=max(now, x0))
    if made is not None:
        schedule.last_occurrence_at = made
    schedule.advance_at = made
    _skip(schedule, [*skipped, *older], unshown=unshown, reason=CATCHUP_REASON, now=now)
    schedule.revision += 1
    schedule.save(update_fields=["last_occurrence_at", "advance_at", "skipped_count", "skipped_reasons", "revision"])
    return 1


def _cancelled_missed(schedule: Schedule, x0: datetime) -> bool:
    """Cancel the call made ahead for x0, missed (older than the catch-up window) when it still
    waits: True. False when nothing waits for it (the timer started it first when the workers
    came back: that one runs, as for any cancel; or it was cancelled or ran already)."""
    call = occurrence_call(tenant_id=schedule.tenant_id, schedule_id=schedule.schedule_id, occurrence_at=x0, lock=True)
    if call is None or call.status != ServiceCall.Status.SCHEDULED or call.attempts:
        return False
    try:
        service_call_cancel(
            tenant_id=call.tenant_id, service_call_id=call.service_call_id, correlation_id=str(schedule.schedule_id)
        )
    except Conflict:
        return False
    return True


def _skip(schedule: Schedule, instants: list[datetime], *, unshown: int = 0, reason: str, now: datetime) -> None:
    """Count skipped occurrences on the schedule (in all and by reason) and raise an event for
    each of `instants` (`unshown` more are counted only: past SKIPPED_EVENTS_MAX in a round)."""
    count = len(instants) + unshown
    if not count:
        return
    schedule.skipped_count += count
    schedule.skipped_reasons = {**(schedule.skipped_reasons or {})}
    schedule.skipped_reasons[reason] = schedule.skipped_reasons.get(reason, 0) + count
    outbox_append(
        events=[
            NewEvent(
                tenant_id=schedule.tenant_id,
                aggregate_id=schedule.schedule_id,
                type=OutboxEvent.Type.OCCURRENCE_SKIPPED,
                payload={"scheduleId": str(schedule.schedule_id), "occurrenceAt": iso_ms(at), "reason": reason},
                correlation_id=str(schedule.schedule_id),
                at=now,
            )
            for at in sorted(instants)
        ]
    )
    logger.warning(
        "skipped %d occurrence(s) of a schedule (%s)",
        count,
        reason,
        extra={"tenantId": schedule.tenant_id, "correlationId": str(schedule.schedule_id)},
    )


def schedule_sealed_values_rotate(*, dry_run: bool = False) -> RotationResult:
    """Re-encrypt every sealed header value of every schedule under the first key (each row a
    conditional update on its old spec). A row sealed under a key no longer configured is
    reported in `failed` and left as it is."""
    result = RotationResult(failed=[])
    for schedule_id, spec in Schedule.objects.order_by("schedule_id").values_list("schedule_id", "request_spec"):
        result.examined += 1
        headers = (spec or {}).get("headers") or {}
        if not any(is_sealed(value) for value in headers.values()):
            continue
        try:
            rotated = rotate_sealed(headers)
        except SecretUnavailable:
            result.failed.append(str(schedule_id))  # type: ignore[union-attr]
            continue
        if rotated == headers:
            continue
        result.rotated += 1
        if dry_run:
            continue
        with transaction.atomic():
            current = Schedule.objects.select_for_update().filter(pk=schedule_id).values_list("request_spec", flat=True)
            if list(current) == [spec]:  # unchanged meanwhile (else its new headers are sealed anew)
                Schedule.objects.filter(pk=schedule_id).update(request_spec={**spec, "headers": rotated})
    return result
