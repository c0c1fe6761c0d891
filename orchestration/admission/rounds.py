"""The engine's flow loop's reads: which held calls a round may start, in due order, tenant by
tenant (docs/flow-control.md).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from orchestration.admission.held import _gauges, _oldest_held, _queues, _running_counts, _tenants_with_held, _undecided
from orchestration.admission.limits import _limits_of
from orchestration.flow import (
    FlowLimits,
    Gauge,
    competes,
)
from orchestration.models import FlowControl

# --- The flow loop's reads ------------------------------------------------------------------------


@dataclass
class FlowRound:
    """What the flow loop should try to start now: per tenant, its oldest held calls that
    fit the room the limits seem to have (the start decides for sure)."""

    starts: list[tuple[str, list[uuid.UUID]]] = field(default_factory=list)
    # Whether any call is held at all (the loop polls more slowly when none is).
    held: bool = False
    # When a rate limit next lets a held call be admitted (epoch s), if sooner than the next poll.
    next_at: float | None = None


def flow_round(*, batch: int, max_tenants: int = 200) -> FlowRound:
    """Read-only: the held calls to start next, oldest first per tenant (docs/flow-control.md,
    'The flow loop')."""
    tenants = _tenants_with_held(max_tenants)
    result = FlowRound(held=bool(tenants))
    if not tenants:
        return result
    controls = {c.tenant_id: c for c in FlowControl.objects.filter(pk__in=tenants)}
    running = _running_counts(tenants)
    now = time.time()

    def later(gauge: Gauge) -> None:
        at = gauge.next_room_at()
        if at is not None and at > now:
            result.next_at = at if result.next_at is None else min(result.next_at, at)

    for tenant_id in tenants:
        control = controls.get(tenant_id)
        limits = _limits_of(control, tenant_id)
        tenant_gauge, host_gauges = _gauges(control, limits, running.get(tenant_id, {}))
        room = tenant_gauge.room(now)
        if room == 0:
            later(tenant_gauge)
            continue
        cap = batch if room is None else min(batch, room)
        picks: list[tuple] = []
        for queue in _queues(tenant_id):
            gauge = host_gauges.get(queue)
            queue_room = cap if gauge is None else gauge.room(now)
            if queue_room is None:
                queue_room = cap
            if queue_room == 0:
                later(gauge)  # type: ignore[arg-type]
                continue
            picks.extend((*row, queue) for row in _oldest_held(tenant_id, queue, limit=min(cap, queue_room)))
        picks.sort()
        picks = _not_behind_undecided(tenant_id, limits, host_gauges, picks[:cap], now=now)
        if picks:
            result.starts.append((tenant_id, [pk for _, pk, _ in picks]))
    return result


def _not_behind_undecided(
    tenant_id: str, limits: FlowLimits, hosts: dict[str, Gauge], picks: list[tuple], *, now: float
) -> list[tuple]:
    """The picks (due_at, service_call_id, queue) that no older undecided call competes with:
    the start would hold the others again, a write transaction for nothing, every round."""
    if not picks:
        return picks
    undecided = _undecided(
        tenant_id,
        limits,
        queues={queue for _, _, queue in picks},
        now=datetime.fromtimestamp(now, UTC),
        newest=max(due_at for due_at, _, _ in picks),
    )
    return [
        (due_at, pk, queue)
        for due_at, pk, queue in picks
        if not any(
            u.rank < (due_at, str(pk)) and competes(u.queue, queue, limits=limits, hosts=hosts, now=now)
            for u in undecided
        )
    ]
