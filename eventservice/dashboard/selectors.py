"""Reads the pages need that no module offers: a call's events, backlogs, recent failures.

Every read that touches tenant data takes the tenant ids the viewer may see (None: all, for
superusers).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, QuerySet

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from workers.models import LoopRun, WorkerSession

LAG_WINDOW = timedelta(minutes=15)
LAG_SAMPLE = 2000


def events_for_call(*, tenant_id: str, service_call_id: uuid.UUID) -> QuerySet[OutboxEvent]:
    """A call's outbox rows in publication order (uses outbox_tenant_aggregate)."""
    return OutboxEvent.objects.filter(tenant_id=tenant_id, aggregate_id=service_call_id).order_by("id")


def _scoped(qs: QuerySet, tenant_ids: Collection[str] | None, field: str = "tenant_id") -> QuerySet:
    return qs if tenant_ids is None else qs.filter(**{f"{field}__in": list(tenant_ids)})


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def outbox_backlog(*, now: datetime, tenant_ids: Collection[str] | None) -> dict[str, Any]:
    """Unpublished events, the oldest one's age, and publication lag of recent events."""
    pending = _scoped(OutboxEvent.objects.filter(published_at__isnull=True), tenant_ids)
    oldest = pending.order_by("id").values_list("created_at", flat=True).first()
    recent = _scoped(OutboxEvent.objects.filter(published_at__gte=now - LAG_WINDOW), tenant_ids)
    lags = [
        lag.total_seconds() * 1000
        for lag in recent.order_by("-published_at")
        .annotate(lag=F("published_at") - F("created_at"))
        .values_list("lag", flat=True)[:LAG_SAMPLE]
        if lag is not None
    ]
    return {
        "unpublished": pending.count(),
        "retrying": pending.filter(attempts__gt=0).count(),
        "oldest_age_ms": (now - oldest).total_seconds() * 1000 if oldest else None,
        "lag_p50_ms": _percentile(lags, 0.5),
        "lag_p99_ms": _percentile(lags, 0.99),
        "lag_max_ms": max(lags) if lags else None,
        "lag_sample": len(lags),
        "lag_window_minutes": int(LAG_WINDOW.total_seconds() // 60),
    }


@dataclass(frozen=True)
class WorkerRow:
    session: WorkerSession
    heartbeat_age_s: float
    stale: bool


def worker_sessions(*, now: datetime, limit: int = 20, stopped: int = 5) -> list[WorkerRow]:
    """Sessions still marked running (uses worker_sessions_running), then the last few stopped."""
    running = list(
        WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING).order_by("-last_heartbeat_at")[:limit]
    )
    ended = list(
        WorkerSession.objects.exclude(status=WorkerSession.Status.RUNNING).order_by("-last_heartbeat_at")[:stopped]
    )
    rows = []
    for session in running + ended:
        age = (now - session.last_heartbeat_at).total_seconds()
        stale = session.status == WorkerSession.Status.RUNNING and age > settings.WORKER_STALE_SECONDS
        rows.append(WorkerRow(session, age, stale))
    return rows


def recent_failed_calls(*, tenant_ids: Collection[str] | None, limit: int = 20) -> list[ServiceCall]:
    # Newest submitted first: ids are time-ordered, so this walks service_calls_tenant_status.
    qs = ServiceCall.objects.filter(status=ServiceCall.Status.FAILED).order_by("-service_call_id")
    return list(_scoped(qs, tenant_ids)[:limit])


def recent_loop_errors(*, limit: int = 20) -> list[LoopRun]:
    return list(LoopRun.objects.filter(errors__gt=0).select_related("session").order_by("-started_at")[:limit])


def call_tenant_id(*, service_call_id: uuid.UUID, tenant_ids: Collection[str]) -> str | None:
    """Which of these tenants owns the call (a shared link may point into another of them)."""
    return (
        ServiceCall.objects.filter(pk=service_call_id, tenant_id__in=list(tenant_ids))
        .values_list("tenant_id", flat=True)
        .first()
    )
