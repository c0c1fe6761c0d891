"""Reads of the outbox: a call's events, the events tail, and the backlog."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, QuerySet

from core.ids import utcnow
from outbox.models import OutboxEvent

# The events tail waits this long behind a tenant's unpublished event, so a client polling
# `after=<last seen>` never skips an event published late; a row that keeps failing longer
# than this stops holding the tail back: nothing blocks behind one poisoned row (docs/api.md,
# 'Events feed').
EVENTS_TAIL_HOLD_SECONDS = 30
LAG_WINDOW = timedelta(minutes=15)
LAG_SAMPLE = 2000


def events_for_call(*, tenant_id: str, service_call_id: uuid.UUID | str) -> QuerySet[OutboxEvent]:
    """A call's events in publication order (uses outbox_tenant_aggregate)."""
    return OutboxEvent.objects.filter(tenant_id=tenant_id, aggregate_id=service_call_id).order_by("id")


def event_sequence_of(*, tenant_id: str, event_id: uuid.UUID | str) -> int | None:
    """The outbox sequence of a tenant's event, by its envelope id."""
    return OutboxEvent.objects.filter(tenant_id=tenant_id, event_id=event_id).values_list("id", flat=True).first()


def events_published_after(
    *, tenant_id: str, after: int = 0, limit: int = 100, now: datetime | None = None
) -> list[OutboxEvent]:
    """A tenant's published events after a sequence, oldest first (uses outbox_tenant_published).

    Stops before the tenant's oldest unpublished event younger than EVENTS_TAIL_HOLD_SECONDS.
    """
    now = now or utcnow()
    qs = OutboxEvent.objects.filter(tenant_id=tenant_id, published_at__isnull=False, id__gt=after)
    holding = (
        OutboxEvent.objects.filter(
            tenant_id=tenant_id,
            published_at__isnull=True,
            id__gt=after,
            created_at__gt=now - timedelta(seconds=EVENTS_TAIL_HOLD_SECONDS),
        )
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )
    if holding is not None:
        qs = qs.filter(id__lt=holding)
    return list(qs.order_by("id")[:limit])


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def outbox_backlog(
    *, now: datetime, tenant_ids: Collection[str] | None = None, with_lag: bool = False
) -> dict[str, Any]:
    """Unpublished events, the oldest one's age (uses outbox_unpublished), and optionally the
    publication lag of recent events. tenant_ids=None means all tenants."""
    pending = OutboxEvent.objects.filter(published_at__isnull=True)
    if tenant_ids is not None:
        pending = pending.filter(tenant_id__in=list(tenant_ids))
    oldest = pending.order_by("id").values_list("created_at", flat=True).first()
    backlog: dict[str, Any] = {
        "unpublished": pending.count(),
        "retrying": pending.filter(attempts__gt=0).count(),
        "oldest_age_ms": max(0.0, (now - oldest).total_seconds() * 1000) if oldest else None,
    }
    if with_lag:
        recent = OutboxEvent.objects.filter(published_at__gte=now - LAG_WINDOW)
        if tenant_ids is not None:
            recent = recent.filter(tenant_id__in=list(tenant_ids))
        lags = [
            lag.total_seconds() * 1000
            for lag in recent.order_by("-published_at")
            .annotate(lag=F("published_at") - F("created_at"))
            .values_list("lag", flat=True)[:LAG_SAMPLE]
            if lag is not None
        ]
        backlog.update(
            {
                "lag_p50_ms": _percentile(lags, 0.5),
                "lag_p99_ms": _percentile(lags, 0.99),
                "lag_max_ms": max(lags) if lags else None,
                "lag_sample": len(lags),
                "lag_window_minutes": int(LAG_WINDOW.total_seconds() // 60),
            }
        )
    return backlog
