"""Overlap: what a schedule's call does when it falls due while another call of its schedule is
still going (docs/schedules.md, "Overlap"), decided in the start's transaction, the due rows
locked, so once however many clusters start calls:

- `skip`: it is cancelled, its occurrence skipped (counted on the schedule, an event);
- `bufferOne`: it waits, Scheduled, until nothing of its schedule is going; one waits at most,
  a second is skipped;
- `allowAll`: it starts, whatever goes on;
- `cancelOther`: the schedule's earlier calls still Scheduled (waiting for a retry, waiting to
  start) are cancelled, and it starts; a Running one finishes its attempt (a request on the
  wire cannot be taken back).

Going: Running, or Scheduled for a retry (it has started). A call made ahead and not yet due is
not going. Calls of a schedule due together (a catch-up, a backfill) are decided in occurrence
order: one whose earlier occurrence is due and not started yet waits a moment for it. Only an
occurrence's first start is decided: a retry goes on under the call's retry policy.

A sibling that another transaction holds at that moment (it is being started, finished or
cancelled) leaves the decision open: the call is not started now, and its timer fires again a
moment later (PUT_OFF).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction

from core.ids import iso_ms
from orchestration.admission import held_since_cleared_on_cancel
from orchestration.models import ServiceCall
from orchestration.services.calls import call_event, enqueue_start
from outbox.models import OutboxEvent
from outbox.services import NewEvent, outbox_append
from timer.services import timer_rearm, timers_discard

SKIP, BUFFER_ONE, ALLOW_ALL, CANCEL_OTHER = "skip", "bufferOne", "allowAll", "cancelOther"
BUFFERED, SKIPPED, SUPERSEDED = (
    ServiceCall.OverlapState.BUFFERED,
    ServiceCall.OverlapState.SKIPPED,
    ServiceCall.OverlapState.SUPERSEDED,
)
# The reason of a ScheduleOccurrenceSkipped event (and of the schedule's count) for these.
OVERLAP_REASON = "overlap"
# A call that waits (bufferOne) is due again this much later at the latest, in case the end of
# the call it waits for was missed; that end releases it at once (overlap_release).
BUFFER_RECHECK = timedelta(seconds=60)
# A call whose decision waits (an earlier occurrence starts first, a sibling is held by another
# transaction) is tried again this much later, by its timer.
PUT_OFF = timedelta(milliseconds=50)

_SIBLING_FIELDS = (
    "service_call_id",
    "tenant_id",
    "schedule_id",
    "occurrence_at",
    "status",
    "attempts",
    "due_at",
    "overlap_state",
    "correlation_id",
    "held_since",
    "held_queue",
    "held_ms",
)


def overlap_decide(rows: list[ServiceCall], *, now: datetime) -> list[ServiceCall]:
    """Of these due rows, locked for their start, those that may start now (in their order).
    The others are skipped, buffered or left for a moment, and earlier calls that `cancelOther`
    replaces are cancelled, all in the caller's transaction."""
    groups: dict[tuple[str, uuid.UUID], list[ServiceCall]] = defaultdict(list)
    for row in rows:
        if row.overlap not in ("", ALLOW_ALL) and row.attempts == 0:
            groups[(row.tenant_id, row.schedule_id)].append(row)
    if not groups:
        return rows
    decided = {row.pk for group in groups.values() for row in group}
    # The batch's other calls of those schedules (a retry, an allowAll call) start with it: going.
    beside: dict[tuple[str, uuid.UUID], list[ServiceCall]] = defaultdict(list)
    for row in rows:
        if row.pk not in decided and (row.tenant_id, row.schedule_id) in groups:
            beside[(row.tenant_id, row.schedule_id)].append(row)
    siblings, held_elsewhere = _siblings(groups, exclude={row.pk for row in rows}, now=now)
    start: set[uuid.UUID] = set()
    skip: list[ServiceCall] = []
    buffer: list[ServiceCall] = []
    cancel: list[ServiceCall] = []
    put_off: list[ServiceCall] = []
    first_please: list[ServiceCall] = []
    for key, group in groups.items():
        if key in held_elsewhere:
            put_off += group
            continue
        group.sort(key=lambda row: row.occurrence_at)
        others = siblings.get(key, [])
        going = bool(beside[key]) or any(_going(call, now) for call in others)
        waiting = any(_buffered(call, now) for call in others)
        queued = [call for call in others if _queued(call, now)]
        for index, row in enumerate(group):
            if row.overlap == CANCEL_OTHER:
                if any(later.overlap == CANCEL_OTHER for later in group[index + 1 :]):
                    cancel.append(row)  # a later occurrence due with it takes over
                    continue
                cancel += [
                    call
                    for call in [*others, *beside[key]]
                    if call.status == ServiceCall.Status.SCHEDULED and call.occurrence_at < row.occurrence_at
                ]
                start.add(row.pk)
                going = True
                continue
            ahead = [call for call in queued if (call.due_at, call.occurrence_at) < (row.due_at, row.occurrence_at)]
            if ahead:
                # An earlier occurrence, due before it and not started yet, goes first (at once).
                put_off.append(row)
                first_please += ahead
            elif not going:
                start.add(row.pk)
                going = True
            elif row.overlap == BUFFER_ONE and not waiting:
                buffer.append(row)
                waiting = True
            else:
                skip.append(row)
    _cancel(skip, state=SKIPPED, now=now)
    _cancel(cancel, state=None, now=now)
    _buffer(buffer, now=now)
    _put_off(put_off, now=now)
    _arm(first_please, at=now)
    cancelled = {call.pk for call in cancel}
    return [row for row in rows if row.pk in start or (row.pk not in decided and row.pk not in cancelled)]


def _going(call: ServiceCall, now: datetime) -> bool:
    """Running, waiting for a retry, or a buffered call released and about to start."""
    if call.status == ServiceCall.Status.RUNNING or call.attempts > 0:
        return True
    return call.overlap_state == BUFFERED and call.due_at <= now


def _buffered(call: ServiceCall, now: datetime) -> bool:
    """Waiting for the schedule's going call (bufferOne), not yet released."""
    return (
        call.status == ServiceCall.Status.SCHEDULED
        and call.attempts == 0
        and call.overlap_state == BUFFERED
        and call.due_at > now
    )


def _queued(call: ServiceCall, now: datetime) -> bool:
    """Due and not started, neither buffered nor held by flow control: its start is near."""
    return (
        call.status == ServiceCall.Status.SCHEDULED
        and call.attempts == 0
        and call.overlap_state != BUFFERED
        and call.held_since is None
        and call.due_at <= now
    )


def _siblings(
    groups: dict[tuple[str, uuid.UUID], list[ServiceCall]], *, exclude: set[uuid.UUID], now: datetime
) -> tuple[dict[tuple[str, uuid.UUID], list[ServiceCall]], set[tuple[str, uuid.UUID]]]:
    """The other unfinished calls of these schedules that bear on a decision (going, waiting, or
    due before the latest of the group), by schedule, as they are once locked; and the
    schedules one of whose such calls another transaction holds (PostgreSQL: skipped by the
    lock; on SQLite the write lock keeps others out). A first read finds them, the locking read
    gives what the decision uses: a change committed in between (a finish) is seen."""
    latest = {key: max(row.occurrence_at for row in group) for key, group in groups.items()}

    def bearing(call: ServiceCall) -> bool:
        key = (call.tenant_id, call.schedule_id)
        return key in groups and (
            _going(call, now) or _buffered(call, now) or (call.due_at <= now and call.occurrence_at < latest[key])
        )

    live = (
        ServiceCall.objects.filter(
            tenant_id__in={tenant_id for tenant_id, _ in groups},
            schedule_id__in={schedule_id for _, schedule_id in groups},
            status__in=(ServiceCall.Status.SCHEDULED, ServiceCall.Status.RUNNING),
        )
        .exclude(pk__in=exclude)
        .only(*_SIBLING_FIELDS)
    )
    found_first = {call.pk: call for call in live if bearing(call)}
    found: dict[tuple[str, uuid.UUID], list[ServiceCall]] = defaultdict(list)
    if not found_first:
        return found, set()
    locked = {
        call.pk: call
        for call in ServiceCall.objects.select_for_update(skip_locked=True)
        .filter(pk__in=list(found_first))
        .only(*_SIBLING_FIELDS)
    }
    held = set()
    for pk, call in found_first.items():
        key = (call.tenant_id, call.schedule_id)
        if pk not in locked:
            held.add(key)
        elif locked[pk].status in (ServiceCall.Status.SCHEDULED, ServiceCall.Status.RUNNING):
            found[key].append(locked[pk])
    return found, held


def _cancel(calls: list[ServiceCall], *, state: str | None, now: datetime) -> None:
    """Scheduled -> Cancelled for the policy: `skipped` (never ran), or, with `state` None,
    `skipped` or `superseded` as the call had tried or not (cancelOther)."""
    if not calls:
        return
    events: list[NewEvent] = []
    for call in calls:
        call_state = state or (SUPERSEDED if call.attempts else SKIPPED)
        changed = ServiceCall.objects.filter(pk=call.pk, status=ServiceCall.Status.SCHEDULED).update(
            status=ServiceCall.Status.CANCELLED,
            finished_at=now,
            overlap_state=call_state,
            **held_since_cleared_on_cancel(call, now=now),
        )
        if not changed:  # cannot happen: locked above, or under SQLite's write lock
            continue
        events.append(
            call_event(
                call,
                OutboxEvent.Type.CANCELLED,
                {"cancelledAt": iso_ms(now), "attempt": call.attempts, "reason": OVERLAP_REASON},
                now,
            )
        )
        if call_state == SKIPPED:
            events.append(
                NewEvent(
                    tenant_id=call.tenant_id,
                    aggregate_id=call.schedule_id,
                    type=OutboxEvent.Type.OCCURRENCE_SKIPPED,
                    payload={
                        "scheduleId": str(call.schedule_id),
                        "occurrenceAt": iso_ms(call.occurrence_at),
                        "reason": OVERLAP_REASON,
                    },
                    correlation_id=str(call.schedule_id),
                    at=now,
                )
            )
    timers_discard(keys=[(call.tenant_id, call.pk) for call in calls])
    outbox_append(events=events)


def _put_off(calls: list[ServiceCall], *, now: datetime) -> None:
    """Not decided now: their timers fire again in a moment (the call stays due as it was)."""
    _arm(calls, at=now + PUT_OFF)


def _arm(calls: Iterable[ServiceCall], *, at: datetime) -> None:
    for call in {call.pk: call for call in calls}.values():
        timer_rearm(tenant_id=call.tenant_id, service_call_id=call.pk, due_at=at, correlation_id=call.correlation_id)


def _buffer(calls: list[ServiceCall], *, now: datetime) -> None:
    """These wait for their schedule's going call: due again BUFFER_RECHECK later at the latest."""
    for call in calls:
        due_at = now + BUFFER_RECHECK
        # A call flow control held and then admitted ends that wait: it waits for its schedule now.
        ServiceCall.objects.filter(pk=call.pk, status=ServiceCall.Status.SCHEDULED).update(
            due_at=due_at, overlap_state=BUFFERED, **held_since_cleared_on_cancel(call, now=now)
        )
        timer_rearm(
            tenant_id=call.tenant_id, service_call_id=call.pk, due_at=due_at, correlation_id=call.correlation_id
        )


def overlap_release(schedules: Iterable[tuple[str, uuid.UUID]], *, now: datetime) -> int:
    """A call of these schedules ended (finished, or cancelled): the call each buffers starts
    now (its start decides again). In the ending's transaction; returns how many."""
    keys = set(schedules)
    if not keys:
        return 0
    waiting = [
        call
        for call in ServiceCall.objects.filter(
            tenant_id__in={tenant_id for tenant_id, _ in keys},
            schedule_id__in={schedule_id for _, schedule_id in keys},
            status=ServiceCall.Status.SCHEDULED,
            attempts=0,
            overlap_state=BUFFERED,
            due_at__gt=now,
        ).only("service_call_id", "tenant_id", "schedule_id", "correlation_id")
        if (call.tenant_id, call.schedule_id) in keys
    ]
    for call in waiting:
        ServiceCall.objects.filter(pk=call.pk, status=ServiceCall.Status.SCHEDULED).update(due_at=now)
        timer_rearm(tenant_id=call.tenant_id, service_call_id=call.pk, due_at=now, correlation_id=call.correlation_id)
        transaction.on_commit(lambda call=call: enqueue_start(call.tenant_id, call.service_call_id))
    return len(waiting)
