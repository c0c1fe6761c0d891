"""The schedules loop's work (docs/schedules.md): one round per schedule whose call made ahead came
due, which makes the next occurrence ahead and settles the occurrences missed while no worker
ran (the catch-up window: those within it run once each, older ones are skipped, counted and
raised as ScheduleOccurrenceSkipped events). Each round is one transaction under the schedule's
row lock, conditional on the revision it planned from."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from core.errors import Conflict
from core.ids import iso_ms, utcnow
from orchestration.models import ServiceCall
from orchestration.services import service_call_cancel
from outbox.models import OutboxEvent
from outbox.services import NewEvent, outbox_append
from schedules.cron import jitter_of, occurrences, schedule_occurrences
from schedules.making import make_next, make_occurrence
from schedules.models import Schedule
from schedules.selectors import occurrence_call

logger = logging.getLogger("serviceagent.schedules")

# Missed occurrences run at most this many in a round (the latest within the catch-up window);
# older ones are skipped.
CATCHUP_MAX = 1000
# Skipped occurrences raised as events in a round, at most (the latest); the others are counted.
SKIPPED_EVENTS_MAX = 1000
# Why an occurrence was skipped (the event's `reason`, the count's key).
CATCHUP_REASON = "catchupWindow"
DST_REASON = "dstSkipped"
# Schedules advanced per pass of the loop, at most.
BATCH = 100


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
    for at in schedule_occurrences(schedule, after=schedule.advance_at, end_at=until):
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
    # Missed when its call was due (the occurrence plus its jitter) before the window.
    if x0 + jitter_of(schedule.schedule_id, x0, schedule.jitter_ms) < window_start and _cancelled_missed(schedule, x0):
        skipped.append(x0)
    runs = missed.within[-CATCHUP_MAX:]
    beyond = missed.within[: len(missed.within) - len(runs)]
    for at in runs:  # oldest first: each one due now, started in due order
        make_occurrence(schedule, at, at_once=True)
        schedule.last_occurrence_at = at
    older = [*missed.older_shown, *beyond]
    unshown = missed.older - len(missed.older_shown)
    made = make_next(schedule, after=max(now, x0))
    if made is not None:
        schedule.last_occurrence_at = made
    schedule.advance_at = made
    _skip(schedule, [*skipped, *older], unshown=unshown, reason=CATCHUP_REASON, now=now)
    _skip(schedule, dst_skipped_between(schedule, after=x0, until=made or now), reason=DST_REASON, now=now)
    schedule.revision += 1
    schedule.save(update_fields=["last_occurrence_at", "advance_at", "skipped_count", "skipped_reasons", "revision"])
    return 1


def dst_skipped_between(schedule: Schedule, *, after: datetime, until: datetime) -> list[datetime]:
    """The runs that `dstSkipped: skip` took out of (after, until]: those right after a
    spring-forward jump, which `afterJump` would have run. Counted and raised as the loop plans
    past them (docs/schedules.md, "Daylight saving time")."""
    if schedule.every_s or schedule.dst_skipped != "skip" or until <= after:
        return []
    kept = set(schedule_occurrences(schedule, after=after, end_at=until))
    choices = {"dst_skipped": "afterJump", "dst_repeated": schedule.dst_repeated}
    every = occurrences(schedule.cron, schedule.timezone, after=after, end_at=until, **choices)
    return [at for at in every if at not in kept]


def _cancelled_missed(schedule: Schedule, x0: datetime) -> bool:
    """Cancel the call made ahead for x0, missed (due before the catch-up window) when it still
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
