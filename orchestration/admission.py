"""Flow control on the database (docs/flow-control.md): the tenants' limits, the admission of
due calls at their start, and the reads of the engine's flow loop.

The rules themselves are pure (orchestration.flow); here they meet the rows. The start of
calls (orchestration.services.service_calls_start) calls `admit` inside its transaction, with
the candidate calls already locked: for each tenant with limits it locks the tenant's
flow_controls row (SKIP LOCKED: a start never waits for another cluster's), counts the
tenant's Running calls, reads the oldest held call of each of its queues (and the oldest due
calls that no start has decided yet), decides, moves the GCRA state, and marks the calls that
must wait as held. A held call stays Scheduled, its timer already Reached; the flow loop
(workers.loops.flow) starts it when there is room, through the same start.

Writes (flow_control_set, admit, release_held) run only inside orchestration's services;
everything else here only reads.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Count, QuerySet

from core.db import sql_query, update_many
from core.errors import NotFound, ValidationFailed
from core.ids import utcnow
from orchestration.flow import (
    TENANT_QUEUE,
    UNLIMITED,
    Candidate,
    FlowLimits,
    Gauge,
    Waiting,
    competes,
    plan_admission,
    queue_of,
    target_host,
)
from orchestration.models import FlowControl, ServiceCall
from tenants.ceilings import over_ceiling
from tenants.models import Tenant
from tenants.selectors import tenant_ceilings_get, tenants_with_call_ceilings

# How long a process trusts its list of the tenants that have limits: a limit set on a tenant
# that had none applies to the starts of other processes within this (docs/flow-control.md).
LIMITED_CACHE_SECONDS = 1.0
# Queues of one tenant read per decision: its hosts with limits, the tenant's own, and a few
# left from hosts whose limits were removed while their calls waited.
MAX_QUEUES = 64
# How long after its due time a call that no start has decided yet (another start is deciding
# it now, or it waits for a worker with room) holds back the newer calls of its queue: longer
# than a burst's backlog normally waits, so due order holds across processes and clusters;
# bounded, so that a call whose start keeps failing stops its queue for that long at most
# (docs/flow-control.md, "Due order").
UNDECIDED_SECONDS = 30.0


# --- Which tenants have limits: a per-process cache ---------------------------------------------


class _LimitedTenants:
    """The ids of the tenants with a flow_controls row, re-read at most every second: a tenant
    without limits costs the start one set lookup."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: frozenset[str] = frozenset()
        self._read_at = -1e9

    def ids(self) -> frozenset[str]:
        if time.monotonic() - self._read_at < LIMITED_CACHE_SECONDS:
            return self._ids
        with self._lock:
            if time.monotonic() - self._read_at >= LIMITED_CACHE_SECONDS:
                self._ids = frozenset(FlowControl.objects.values_list("tenant_id", flat=True))
                self._read_at = time.monotonic()
        return self._ids

    def forget(self) -> None:
        with self._lock:
            self._read_at = -1e9


_limited = _LimitedTenants()


def tenant_has_limits(tenant_id: str) -> bool:
    """Whether the tenant has limits, its own or the operator's ceilings on its calls, as this
    process last read them (at most ~1 s old)."""
    if tenant_id in _limited.ids():
        return True
    everyone, own = tenants_with_call_ceilings()
    return everyone or tenant_id in own


def forget_limited_tenants() -> None:
    """Read the list again at the next start (after a change made in this process, or a test)."""
    _limited.forget()


# --- The limits: reads and the one service that sets them -----------------------------------------


def _own_limits(control: FlowControl | None) -> FlowLimits:
    if control is None:
        return UNLIMITED
    return FlowLimits.from_stored(parallelism=control.parallelism, rate=control.rate_per_second, hosts=control.hosts)


def _limits_of(control: FlowControl | None, tenant_id: str) -> FlowLimits:
    """The limits the engine holds the tenant's calls to: its own under the operator's
    ceilings (docs/flow-control.md, "Operator ceilings")."""
    ceilings = tenant_ceilings_get(tenant_id=tenant_id)
    return _own_limits(control).capped(parallelism=ceilings.parallelism, rate=ceilings.rate_per_second)


def flow_limits_get(*, tenant_id: str) -> FlowLimits:
    """The limits the tenant set itself (none: FlowLimits with every limit None)."""
    return _own_limits(FlowControl.objects.filter(pk=tenant_id).first())


def flow_limits_effective(*, tenant_id: str) -> FlowLimits:
    """The limits in force: the tenant's own under the operator's ceilings."""
    return _limits_of(FlowControl.objects.filter(pk=tenant_id).first(), tenant_id)


def _check_ceilings(tenant_id: str, limits: FlowLimits) -> None:
    """A tenant's own limits stay within its ceilings: ValidationFailed naming each field over."""
    ceilings = tenant_ceilings_get(tenant_id=tenant_id)
    errors: dict[str, list[str]] = {}
    for prefix, limit in [("", limits.tenant)] + [(f'hosts["{h}"].', lim) for h, lim in sorted(limits.hosts.items())]:
        for name, value, ceiling in (
            ("parallelism", limit.parallelism, ceilings.parallelism),
            ("ratePerSecond", limit.rate, ceilings.rate_per_second),
        ):
            if (problem := over_ceiling(name, value, ceiling)) is not None:
                errors.setdefault(f"{prefix}{name}", []).append(problem)
    if errors:
        raise ValidationFailed(errors)


def flow_control_set(*, tenant_id: str, limits: FlowLimits) -> FlowLimits:
    """Replace the tenant's limits (checked by orchestration.flow.validate_flow_control, and
    here against the operator's ceilings: ValidationFailed naming the field). No
    limit at all removes the row (unless ceilings limit the tenant's calls); the rate state of a host or of the tenant is kept while its
    rate stays. Calls held meanwhile start under the new limits; other processes apply a
    limit on a tenant that had none within LIMITED_CACHE_SECONDS."""
    if not Tenant.objects.filter(pk=tenant_id).exists():
        raise NotFound(f"Tenant {tenant_id!r} not found.")
    _check_ceilings(tenant_id, limits)
    with transaction.atomic():
        current = FlowControl.objects.select_for_update().filter(pk=tenant_id).first()
        if not limits.limited and not (current is not None and tenant_ceilings_get(tenant_id=tenant_id).limits_calls):
            # (A row the operator's ceilings use keeps its rate state.)
            if current is not None:
                current.delete()
        else:
            tats = dict(current.host_tats or {}) if current is not None else {}
            row = current or FlowControl(tenant_id=tenant_id)
            row.parallelism = limits.tenant.parallelism
            row.rate_per_second = limits.tenant.rate
            row.hosts = limits.as_wire()["hosts"]
            row.tenant_tat = row.tenant_tat if limits.tenant.rate is not None else None
            row.host_tats = {
                host: tat for host, tat in tats.items() if host in limits.hosts and limits.hosts[host].rate is not None
            }
            row.updated_at = utcnow()
            row.save()
    forget_limited_tenants()
    return flow_limits_get(tenant_id=tenant_id)


def _held() -> QuerySet[ServiceCall]:
    # The partial index service_calls_held answers every read of held calls.
    return ServiceCall.objects.filter(status=ServiceCall.Status.SCHEDULED, held_since__isnull=False)


def any_held() -> bool:
    """Whether any call waits for flow control: the flow loop's look, fifty times a second,
    written once per process (core.db.sql_query); an index probe of service_calls_held."""
    return bool(
        sql_query(
            "SELECT 1 FROM {c} WHERE {c.status} = %s AND {c.held_since} IS NOT NULL LIMIT 1",
            [ServiceCall.Status.SCHEDULED.value],
            c=ServiceCall,
        )
    )


def held_count(*, tenant_id: str) -> int:
    """How many of the tenant's calls wait for flow control now."""
    return _held().filter(tenant_id=tenant_id).count()


def held_ms_of(call: ServiceCall, *, now: datetime | None = None) -> int:
    """How long a call has waited for flow control, the wait in progress included."""
    total = call.held_ms or 0
    if call.held_since is not None:
        total += max(0, int(((now or utcnow()) - call.held_since).total_seconds() * 1000))
    return total


# --- Index probes over held calls ---------------------------------------------------------------


def _tenants_with_held(limit: int) -> list[str]:
    """The tenants that have held calls: one probe of service_calls_held per tenant."""
    tenants: list[str] = []
    if not any_held():
        return tenants
    rows = _held().order_by("tenant_id").values_list("tenant_id", flat=True)
    tenant = rows.first()
    while tenant is not None and len(tenants) < limit:
        tenants.append(tenant)
        tenant = rows.filter(tenant_id__gt=tenant).first()
    return tenants


def _queues(tenant_id: str) -> list[str]:
    """The queues a tenant's held calls wait in: one probe per queue."""
    queues: list[str] = []
    rows = _held().filter(tenant_id=tenant_id).order_by("held_queue").values_list("held_queue", flat=True)
    queue = rows.first()
    while queue is not None and len(queues) < MAX_QUEUES:
        queues.append(queue)
        queue = rows.filter(held_queue__gt=queue).first()
    return queues


def _oldest_held(tenant_id: str, queue: str, *, limit: int, exclude: Sequence[uuid.UUID] = ()) -> list[tuple]:
    """(due_at, service_call_id) of the oldest held calls of one queue, in due order."""
    rows = _held().filter(tenant_id=tenant_id, held_queue=queue)
    if exclude:
        rows = rows.exclude(service_call_id__in=list(exclude))
    return list(rows.order_by("due_at", "service_call_id").values_list("due_at", "service_call_id")[:limit])


def _undecided(
    tenant_id: str,
    limits: FlowLimits,
    *,
    queues: Collection[str],
    now: datetime,
    newest: datetime,
    exclude: Sequence[uuid.UUID] = (),
) -> list[Waiting]:
    """The oldest call of each of `queues` that could compete (and the oldest of all, whatever
    its queue, when the tenant has a limit of its own) that is
    due, not after `newest`, and neither held nor started, outside `exclude`: a call another
    start is deciding at this moment (its transaction has locked the call and waits for, or
    skipped, the tenant's row), or one that waits for a worker with room. It goes before the
    newer calls it competes with, as a held one would. Only calls due within the last
    UNDECIDED_SECONDS count. Index probes of service_calls_startable_tenant, which find nothing
    unless starts race or a backlog waits for room.

    The oldest of all stands for the other queues: exact where that call is the one competing
    (an older call of a host at its limit holds nobody else back, and a newer one of another
    host behind it is then missed)."""
    rows = ServiceCall.objects.filter(
        tenant_id=tenant_id,
        status=ServiceCall.Status.SCHEDULED,
        held_since__isnull=True,
        due_at__gt=now - timedelta(seconds=UNDECIDED_SECONDS),
        due_at__lte=min(now, newest),
    )
    if exclude:
        rows = rows.exclude(service_call_id__in=list(exclude))
    rows = rows.order_by("due_at", "service_call_id")
    found: dict[str, Waiting] = {}

    def probe(queue_rows: QuerySet[ServiceCall]) -> None:
        for due_at, pk, host in queue_rows.values_list("due_at", "service_call_id", "target_host")[:1]:
            queue = queue_of(host, limits)
            found.setdefault(queue, Waiting(queue=queue, due_at=due_at, order=str(pk)))

    for queue in queues:
        if queue != TENANT_QUEUE:
            probe(rows.filter(target_host=queue))
        elif limits.tenant.limited:  # without a limit of its own, its queue's calls never wait
            probe(rows.exclude(target_host__in=list(limits.hosts)) if limits.hosts else rows)
    if limits.tenant.limited and limits.hosts and set(queues) != {TENANT_QUEUE, *limits.hosts}:
        probe(rows)
    return list(found.values())


def _running_counts(tenant_ids: Sequence[str]) -> dict[str, dict[str | None, int]]:
    """Running calls per tenant and target host (service_calls_tenant_status)."""
    counts: dict[str, dict[str | None, int]] = defaultdict(dict)
    rows = (
        ServiceCall.objects.filter(tenant_id__in=list(tenant_ids), status=ServiceCall.Status.RUNNING)
        .values_list("tenant_id", "target_host")
        .annotate(n=Count("service_call_id"))
        .order_by()
    )
    for tenant_id, host, n in rows:
        counts[tenant_id][host] = n
    return counts


def _gauges(
    control: FlowControl | None, limits: FlowLimits, running: dict[str | None, int]
) -> tuple[Gauge, dict[str, Gauge]]:
    tenant = Gauge(limits.tenant, running=sum(running.values()), tat=control.tenant_tat if control else None)
    tats = (control.host_tats or {}) if control else {}
    hosts = {
        host: Gauge(limit, running=running.get(host, 0), tat=tats.get(host)) for host, limit in limits.hosts.items()
    }
    return tenant, hosts


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
    for queue, ids in moved.items():
        ServiceCall.objects.filter(pk__in=ids, status=ServiceCall.Status.SCHEDULED).update(held_queue=queue)


def starts_place(later: dict[uuid.UUID, datetime]) -> None:
    """The start time of the calls admitted to start a moment after now (their rate's TAT):
    their request waits until then. Inside the start, after the rows turned Running."""
    update_many(
        ServiceCall,
        set_fields=["started_at"],
        where_fields=["service_call_id"],
        rows=[(start, pk) for pk, start in later.items()],
    )


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
