"""The calls held by flow control: whether any are, how many and for how long, and the index
probes over them (and over the due calls no start has decided yet) that admission and the flow
loop make.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

from django.db.models import Count, QuerySet

from core.db import sql_query
from core.ids import utcnow
from orchestration.flow import (
    TENANT_QUEUE,
    FlowLimits,
    Gauge,
    Waiting,
    queue_of,
)
from orchestration.models import FlowControl, ServiceCall

# Queues of one tenant read per decision: its hosts with limits, the tenant's own, and a few
# left from hosts whose limits were removed while their calls waited.
MAX_QUEUES = 64
# How long after its due time a call that no start has decided yet (another start is deciding
# it now, or it waits for a worker with room) holds back the newer calls of its queue: longer
# than a burst's backlog normally waits, so due order holds across processes and clusters;
# bounded, so that a call whose start keeps failing stops its queue for that long at most
# (docs/flow-control.md, "Due order").
UNDECIDED_SECONDS = 30.0


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
