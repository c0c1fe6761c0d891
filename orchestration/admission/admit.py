"""The start's admission under the flow_controls row lock: of the locked rows about to start,
those flow control lets start now or a moment later, the others marked held; a held call's
wait released when it starts, or cleared when it is cancelled.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django.db import connection

from core.db import update_many
from core.db.wakeups import Channel, notify
from core.ids import utcnow
from orchestration.admission.held import _gauges, _oldest_held, _queues, _running_counts, _undecided, held_ms_of
from orchestration.admission.limits import _limited, _limits_of, forget_limited_tenants
from orchestration.flow import (
    Candidate,
    Gauge,
    Waiting,
    plan_admission,
    queue_of,
    target_host,
)
from orchestration.models import FlowControl, ServiceCall
from tenants.selectors import tenants_with_call_ceilings

# --- The start: admission under the flow_controls row lock --------------------------------------


def _host_of(row: ServiceCall) -> str | None:
    if row.target_host:
        return row.target_host
    try:  # a row from before flow control
        return target_host((row.request_spec or {}).get("url") or "")
    except ValueError:
        return None


def admit(rows: list[ServiceCall], *, now: datetime) -> tuple[list[ServiceCall], datetime, dict[uuid.UUID, datetime]]:
    """Of the locked Scheduled rows about to start, those flow control lets start, the time
    they start at, and the start of those a rate makes wait a moment longer (admitted up to
    orchestration.flow.LOOKAHEAD_SECONDS early: their request leaves then); the others are
    marked held. Inside the start's transaction.

    Rows of tenants without limits pass untouched (one set lookup each). With limits, `now`
    is read again once the tenants' rows are locked, so starts follow each other in the order
    of their admissions, whichever cluster made them.
    """
    limited = _limited.ids()
    everyone, capped = tenants_with_call_ceilings()
    by_tenant: dict[str, list[ServiceCall]] = defaultdict(list)
    for row in rows:
        if everyone or row.tenant_id in limited or row.tenant_id in capped:
            by_tenant[row.tenant_id].append(row)
    if not by_tenant:
        return rows, now, {}
    tenant_ids = sorted(by_tenant)
    controls = {
        control.tenant_id: control
        for control in FlowControl.objects.select_for_update(skip_locked=True).filter(pk__in=tenant_ids).order_by("pk")
    }
    busy: dict[str, FlowControl] = {}
    if len(controls) < len(tenant_ids) and connection.features.has_select_for_update_skip_locked:
        # Skipped rows are locked by another start deciding for the same tenant: its calls
        # wait for the flow loop rather than this start waiting for that transaction.
        busy = {c.tenant_id: c for c in FlowControl.objects.filter(pk__in=set(tenant_ids) - set(controls))}
    rowless = [t for t in tenant_ids if t not in controls and t not in busy and (everyone or t in capped)]
    if rowless:
        # Only the operator's ceilings limit them, and they have no row yet: made, then locked.
        _ensure_rows(rowless)
        controls.update(
            (control.tenant_id, control)
            for control in FlowControl.objects.select_for_update(skip_locked=True).filter(pk__in=rowless).order_by("pk")
        )
    now = utcnow()
    admitted = [row for row in rows if row.tenant_id not in by_tenant]
    later: dict[uuid.UUID, datetime] = {}
    held: list[tuple[ServiceCall, str]] = []
    running = _running_counts([t for t in tenant_ids if t in controls])
    for tenant_id in tenant_ids:
        tenant_rows = by_tenant[tenant_id]
        control = controls.get(tenant_id)
        if control is None:
            if tenant_id in busy:
                limits = _limits_of(busy[tenant_id], tenant_id)
                held.extend((row, queue_of(_host_of(row), limits)) for row in tenant_rows)
            else:  # its limits were removed since this process read the list
                admitted.extend(tenant_rows)
            continue
        ok, waiting = _decide(control, tenant_rows, running.get(tenant_id, {}), now)
        for row, start in ok:
            admitted.append(row)
            if start > now:
                later[row.pk] = start
        held.extend(waiting)
    _mark_held(held, now=now)
    return admitted, now, later


def _ensure_rows(tenant_ids: list[str]) -> None:
    """A flow_controls row for each tenant whose calls only the operator's ceilings limit: the
    row the start locks and keeps the rate state in. Made once per tenant (ON CONFLICT DO
    NOTHING: a start racing another's insert waits for it that once)."""
    now = utcnow()
    FlowControl.objects.bulk_create(
        [FlowControl(tenant_id=t, updated_at=now, hosts={}, host_tats={}) for t in sorted(tenant_ids)],
        ignore_conflicts=True,
    )
    forget_limited_tenants()


def _decide(
    control: FlowControl, rows: list[ServiceCall], running: dict[str | None, int], now: datetime
) -> tuple[list[tuple[ServiceCall, datetime]], list[tuple[ServiceCall, str]]]:
    limits = _limits_of(control, control.tenant_id)
    tenant_gauge, host_gauges = _gauges(control, limits, running)
    candidates = [Candidate(key=row, due_at=row.due_at, order=str(row.pk), host=_host_of(row)) for row in rows]
    exclude = [row.pk for row in rows]
    waiting = []
    for queue in _queues(control.tenant_id):
        oldest = _oldest_held(control.tenant_id, queue, limit=1, exclude=exclude)
        if oldest:
            waiting.append(Waiting(queue=queue, due_at=oldest[0][0], order=str(oldest[0][1])))
    # An older due call that another start has not decided yet goes first too: it waits like
    # a held one, though nobody has marked it held (yet).
    waiting += _undecided(
        control.tenant_id,
        limits,
        queues={queue_of(c.host, limits) for c in candidates},
        now=now,
        newest=max(row.due_at for row in rows),
        exclude=exclude,
    )
    plan = plan_admission(
        candidates, limits=limits, tenant=tenant_gauge, hosts=host_gauges, waiting=waiting, now=now.timestamp()
    )
    if plan.admitted:
        _store_tats(control, tenant_gauge, host_gauges, now=now.timestamp())
    # A start a rate puts after now is the TAT, a whole microsecond (orchestration.flow.Gauge).
    starts = [(c.key, datetime.fromtimestamp(start, UTC)) for c, start in plan.admitted]
    admitted = [(row, max(start, now)) for row, start in starts]
    return admitted, [(c.key, queue) for c, queue in plan.held]


def _store_tats(control: FlowControl, tenant: Gauge, hosts: dict[str, Gauge], *, now: float) -> None:
    # Only TATs still ahead matter: one in the past means "may start now", like none at all.
    host_tats = {host: g.tat for host, g in hosts.items() if g.limit.rate is not None and g.tat and g.tat > now}
    tenant_tat = tenant.tat if tenant.limit.rate is not None else None
    if tenant_tat == control.tenant_tat and host_tats == (control.host_tats or {}):
        return
    FlowControl.objects.filter(pk=control.tenant_id).update(tenant_tat=tenant_tat, host_tats=host_tats)


def _mark_held(held: list[tuple[ServiceCall, str]], *, now: datetime) -> None:
    """Held from now (if not already), in its queue; a call already held keeps its start time."""
    new: dict[str, list[uuid.UUID]] = defaultdict(list)
    moved: dict[str, list[uuid.UUID]] = defaultdict(list)
    for row, queue in held:
        if row.held_since is None:
            new[queue].append(row.pk)
        elif row.held_queue != queue:
            moved[queue].append(row.pk)
    for queue, ids in new.items():
        ServiceCall.objects.filter(pk__in=ids, status=ServiceCall.Status.SCHEDULED).update(
            held_since=now, held_queue=queue
        )
    if new:  # the flow loop, asleep while none was held, starts them as room frees
        notify(Channel.FLOW)
    for queue, ids in moved.items():
        ServiceCall.objects.filter(pk__in=ids, status=ServiceCall.Status.SCHEDULED).update(held_queue=queue)


def release_held(rows: Sequence[ServiceCall], *, now: datetime) -> dict[uuid.UUID, int]:
    """For the rows about to start that were held: end the wait (held_since cleared, its
    length added to held_ms). Returns each one's wait in milliseconds. Inside the start."""
    waits: dict[uuid.UUID, int] = {}
    updates = []
    for row in rows:
        if row.held_since is None:
            continue
        wait = max(0, int((now - row.held_since) / timedelta(milliseconds=1)))
        waits[row.pk] = wait
        updates.append((None, "", (row.held_ms or 0) + wait, row.pk))
    update_many(
        ServiceCall, set_fields=["held_since", "held_queue", "held_ms"], where_fields=["service_call_id"], rows=updates
    )
    return waits


def held_since_cleared_on_cancel(call: ServiceCall, *, now: datetime) -> dict[str, object]:
    """The fields a cancel sets so that a held call ends its wait (empty for a call not held)."""
    if call.held_since is None:
        return {}
    return {"held_since": None, "held_queue": "", "held_ms": held_ms_of(call, now=now)}
