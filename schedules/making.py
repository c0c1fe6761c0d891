"""Making and cancelling the calls of a schedule's occurrences (docs/schedules.md), shared by the
writes of schedules.services and the loop of schedules.materialize. Each occurrence becomes one
ordinary call (`Scheduled`, due at the occurrence plus its jitter, fired by the timer), made
**ahead**; the call carries `(schedule_id, occurrence_at)`, unique among live calls in the
database, so however many loops (clusters) race, an occurrence makes one live call."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings

from core.db.wakeups import Channel, notify
from core.errors import Conflict, NotFound
from orchestration.models import ServiceCall
from orchestration.retries import RetryPolicy
from orchestration.services import Occurrence, service_call_cancel, service_call_submit
from orchestration.validation import Submission
from schedules.cron import jitter_of, next_schedule_occurrences, schedule_occurrences
from schedules.models import Schedule
from schedules.selectors import waiting_calls

# Occurrences tried in a row when each one already had a call, cancelled (by a pause or a
# change before it came due): an occurrence makes one call, ever. Past this, the loop takes
# the schedule up again when the last one tried comes due.
MAX_TAKEN_IN_A_ROW = 10


def occurrence_submission(
    schedule: Schedule, at: datetime, *, at_once: bool = False
) -> tuple[Submission, dict[str, Any]]:
    """The call of one occurrence, and its header values as stored (sealed): due at the
    occurrence plus its jitter, or at once (a missed occurrence caught up, a backfill)."""
    spec = schedule.request_spec
    headers = dict(spec.get("headers") or {})
    submission = Submission(
        name=schedule.name,
        method=spec["method"],
        url=spec["url"],
        headers={name: "" for name in headers},  # the sealed values go as they are, below
        body=spec.get("body"),
        timeout_ms=spec.get("timeoutMs", settings.EXECUTION_TIMEOUT_MS),
        due_at=None if at_once else at + jitter_of(schedule.schedule_id, at, schedule.jitter_ms),
        tags=list(schedule.tags or []),
        idempotency_key=None,
        retry_policy=RetryPolicy.from_wire(schedule.retry_policy) if schedule.retry_policy else None,
        connection=spec.get("connection"),
    )
    return submission, headers


def make_occurrence(schedule: Schedule, at: datetime, *, at_once: bool = False) -> ServiceCall:
    """The call of the occurrence `at`: made now, or the one already made (by another loop)."""
    return make_occurrence_call(schedule, at, at_once=at_once)[0]


def make_occurrence_call(
    schedule: Schedule, at: datetime, *, at_once: bool = False, overlap: str | None = None
) -> tuple[ServiceCall, bool]:
    """The call of the occurrence `at` and whether it was made now (False: the occurrence's live
    call, made before, by this or another cluster's loop, or by an earlier backfill); `at_once`:
    due now rather than at its time (a past occurrence); `overlap`: the policy the call takes
    instead of the schedule's (a backfill's)."""
    submission, sealed = occurrence_submission(schedule, at, at_once=at_once)
    return service_call_submit(
        tenant_id=schedule.tenant_id,
        submission=submission,
        # Every call of a schedule correlates with the schedule (logs, events).
        correlation_id=str(schedule.schedule_id),
        sealed_headers=sealed,
        occurrence=Occurrence(schedule.schedule_id, at, overlap or schedule.overlap),
    )


def make_next(schedule: Schedule, *, after: datetime) -> datetime | None:
    """Make the first occurrence after `after` that can still make a call; returns it (None:
    the schedule has no more occurrences)."""
    tried = None
    for taken, at in enumerate(
        schedule_occurrences(schedule, after=after, start_at=schedule.start_at, end_at=schedule.end_at)
    ):
        call = make_occurrence(schedule, at)
        if call.status != ServiceCall.Status.CANCELLED:
            return at
        # This occurrence already made its call, and it was cancelled: an occurrence makes one
        # call (service_calls_schedule_occurrence), so the schedule goes on with the next one.
        tried = at
        if taken + 1 >= MAX_TAKEN_IN_A_ROW:
            break
    return tried


def cancel_waiting(calls: Iterable[ServiceCall], correlation_id: str | None) -> int:
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


def replan(schedule: Schedule, *, now: datetime, correlation_id: str | None, call_changed: bool) -> None:
    """Plan the schedule from `now` again: what waits for an occurrence to come is cancelled (all
    that waits, for a pause) and the first occurrence from now on is made. A waiting call for that very occurrence is kept when nothing that
    goes into a call changed (a new end, a new start that does not move it)."""
    waiting = waiting_calls(tenant_id=schedule.tenant_id, schedule_id=schedule.schedule_id, lock=True)
    if schedule.paused:
        cancel_waiting(waiting, correlation_id)
        schedule.advance_at = None
        return
    # A past occurrence's call (a catch-up's, a backfill's, one its overlap policy buffers) was
    # asked for as it is: a change plans the occurrences to come, it runs as made.
    waiting = [call for call in waiting if call.occurrence_at > now]
    first = next_schedule_occurrences(schedule, after=now, count=1, start_at=schedule.start_at, end_at=schedule.end_at)
    keep = None
    if first and not call_changed:
        keep = next((call for call in waiting if call.occurrence_at == first[0]), None)
    cancel_waiting([call for call in waiting if call is not keep], correlation_id)
    made = keep.occurrence_at if keep is not None else make_next(schedule, after=now)
    if made is not None:
        schedule.last_occurrence_at = made
    schedule.advance_at = made
    notify(Channel.SCHEDULES)  # the schedules loop sleeps until the next advance it knew of
