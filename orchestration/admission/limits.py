"""The tenants' flow-control limits: which tenants have any (a per-process cache), their own
and those in force under the operator's ceilings, and the one service that sets them
(docs/flow-control.md).
"""

from __future__ import annotations

import threading
import time

from django.db import connection, transaction

from core.errors import NotFound, ValidationFailed
from core.ids import utcnow
from orchestration.flow import (
    UNLIMITED,
    FlowLimits,
)
from orchestration.models import FlowControl
from tenants.ceilings import over_ceiling
from tenants.models import Tenant
from tenants.selectors import tenant_ceilings_get, tenants_with_call_ceilings

# How long a process trusts its list of the tenants that have limits: a limit set on a tenant
# that had none applies to the starts of other processes within this (docs/flow-control.md).
LIMITED_CACHE_SECONDS = 1.0


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
        # The connection before the lock: the lock's holder never waits for the pool, whose
        # connections the threads waiting for the lock may hold (core/db/pool.py).
        connection.ensure_connection()
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
    """A tenant's own limits stay within its ceilings: ValidationFailed naming each field over.
    A value the tenant already has is kept as it is (a ceiling lowered under it wins anyway), so
    the settings page sent back unchanged, or with another field changed, is not refused."""
    ceilings = tenant_ceilings_get(tenant_id=tenant_id)
    stored = _stored_limits(tenant_id)
    errors: dict[str, list[str]] = {}
    for place, limit in [("", limits.tenant)] + [(h, lim) for h, lim in sorted(limits.hosts.items())]:
        prefix = f'hosts["{place}"].' if place else ""
        for name, value, ceiling in (
            ("parallelism", limit.parallelism, ceilings.parallelism),
            ("ratePerSecond", limit.rate, ceilings.rate_per_second),
        ):
            if value is not None and stored.get((place, name)) == value:
                continue
            if (problem := over_ceiling(name, value, ceiling)) is not None:
                errors.setdefault(f"{prefix}{name}", []).append(problem)
    if errors:
        raise ValidationFailed(errors)


def _stored_limits(tenant_id: str) -> dict[tuple[str, str], float]:
    """The tenant's own limits as stored: {(host or "", field): value}."""
    row = FlowControl.objects.filter(pk=tenant_id).first()
    if row is None:
        return {}
    stored = {("", "parallelism"): row.parallelism, ("", "ratePerSecond"): row.rate_per_second}
    for host, limit in (row.hosts or {}).items():
        stored.update({(host, name): value for name, value in limit.items()})
    return {key: value for key, value in stored.items() if value is not None}


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
