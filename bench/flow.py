"""The flow-control rows (docs/flow-control.md): another tenant's timer lateness while one tenant
sits at its limits with a held backlog, beside the same tenant's lateness alone, in the same
run on the same workers; and how close the limited tenant's starts come to its rate.

Runs in the bench process after django.setup(), with the agent's qcluster running.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from bench.agent import _sleep_until, _submit, ensure_tenant, lateness_seconds, lead_for, submit_ms_per_call
from bench.common import log, summary_ms, wait_until

LIMITED_TENANT = "bench-flow-limited"
OTHER_TENANT = "bench-flow-other"
LIMITS = {"parallelism": 4, "ratePerSecond": 20}
# The workers re-read which tenants have limits every second (docs/flow-control.md).
LIMITS_APPLY_SECONDS = 1.2


def _lateness(prefix: str) -> dict:
    from orchestration.models import ServiceCall

    return summary_ms(lateness_seconds(ServiceCall.objects.filter(tenant_id=OTHER_TENANT, name__startswith=prefix)))


def _round(url: str, prefix: str, count: int, first_due: float, spread: float) -> dict:
    """`count` calls of the other tenant due uniformly over [first_due, first_due + spread]."""
    from orchestration.models import ServiceCall

    dues = [first_due + spread * n / max(1, count - 1) for n in range(count)]
    _submit(OTHER_TENANT, url, dues, prefix)
    _sleep_until(dues[-1])
    wait_until(
        lambda: (
            ServiceCall.objects.filter(
                tenant_id=OTHER_TENANT, name__startswith=prefix, status__in=ServiceCall.TERMINAL
            ).count()
            >= count
        ),
        timeout=30,
        interval=0.05,
    )
    return _lateness(prefix)


def flow_isolation(*, url: str, count: int, backlog: int, spread: float, lead: float) -> dict:
    from orchestration.admission import flow_control_set, held_count
    from orchestration.flow import UNLIMITED, validate_flow_control
    from orchestration.models import ServiceCall

    ensure_tenant(LIMITED_TENANT)
    ensure_tenant(OTHER_TENANT)
    per_call_ms = submit_ms_per_call(url)

    log(f"flow: {count} calls of one tenant over {spread:.0f}s, alone")
    start = time.time() + lead_for(count, per_call_ms, lead)
    alone = _round(url, "flow-alone", count, start, spread)

    log(f"flow: the same beside a tenant limited to {LIMITS} with {backlog} calls due at once")
    flow_control_set(tenant_id=LIMITED_TENANT, limits=validate_flow_control(LIMITS))
    time.sleep(LIMITS_APPLY_SECONDS)
    backlog_due = time.time() + lead_for(backlog + count, per_call_ms, lead)
    _submit(LIMITED_TENANT, url, [backlog_due] * backlog, "flow-backlog")
    window_start = backlog_due + 1.0  # the backlog is held by then
    beside = _round(url, "flow-beside", count, window_start, spread)
    window_end = time.time()
    held_at_end = held_count(tenant_id=LIMITED_TENANT)
    starts = ServiceCall.objects.filter(
        tenant_id=LIMITED_TENANT,
        started_at__gte=datetime.fromtimestamp(window_start, UTC),
        started_at__lt=datetime.fromtimestamp(window_end, UTC),
    ).count()

    # Let the backlog go: without limits it drains at once.
    flow_control_set(tenant_id=LIMITED_TENANT, limits=UNLIMITED)
    drained = wait_until(
        lambda: (
            ServiceCall.objects.filter(tenant_id=LIMITED_TENANT, status__in=ServiceCall.TERMINAL).count() >= backlog
        ),
        timeout=90,
        interval=0.1,
    )
    return {
        "calls": count,
        "backlog": backlog,
        "limits": LIMITS,
        "alone_ms": alone,
        "beside_ms": beside,
        "held_at_window_end": held_at_end,
        "limited_starts_per_second": starts / (window_end - window_start) if window_end > window_start else None,
        "backlog_drained": bool(drained),
    }
