"""Reads of the outbox: a call's events, the events feed, and the backlog."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, QuerySet

from core.partition_queries import made_since
from outbox.models import OutboxEvent, OutboxFeedCounter
from outbox.partitions import OUTBOX_DAYS

LAG_WINDOW = timedelta(minutes=15)
LAG_SAMPLE = 2000


def events_for_call(*, tenant_id: str, service_call_id: uuid.UUID | str) -> QuerySet[OutboxEvent]:
    """A call's events in publication order (uses outbox_tenant_aggregate). Where the outbox is
    partitioned, only from the day the call was made (its id, a UUID v7, says when): no event of
    it is older, so the older days' partitions are not searched."""
    events = OutboxEvent.objects.filter(tenant_id=tenant_id, aggregate_id=service_call_id)
    since = made_since(OUTBOX_DAYS, service_call_id)
    if since is not None:
        events = events.filter(event_id__gte=since)
    return events.order_by("id")


@dataclass(frozen=True)
class FeedPage:
    """One page of a tenant's events feed."""

    events: list[OutboxEvent]
    # The feed number to pass as `after` next time: the last event's, or, once caught up, the
    # tenant's head (past events that `types` filtered out).
    position: int
    done: bool


class FeedPositionAhead(ValueError):
    """`after` is beyond any feed number this tenant has been given."""


def feed_head(*, tenant_id: str) -> int:
    """The last feed number given to the tenant's events; 0 before the first (a primary key read)."""
    return _counter(tenant_id)[0]


def _counter(tenant_id: str) -> tuple[int, int | None, uuid.UUID | None]:
    """The tenant's feed head, and its feed floor (OutboxFeedCounter.floor_seq, floor_key)."""
    row = (
        OutboxFeedCounter.objects.filter(tenant_id=tenant_id).values_list("last_seq", "floor_seq", "floor_key").first()
    )
    return row if row is not None else (0, None, None)


def feed_seq_of_event(*, tenant_id: str, event_id: uuid.UUID | str) -> int | None:
    """The feed number of a tenant's event by its envelope id; None if there is no such event of
    this tenant or it has not been published yet."""
    return (
        OutboxEvent.objects.filter(tenant_id=tenant_id, event_id=event_id, feed_seq__isnull=False)
        .values_list("feed_seq", flat=True)
        .first()
    )


def events_feed(*, tenant_id: str, after: int = 0, limit: int = 50, types: Collection[str] | None = None) -> FeedPage:
    """A tenant's published events after feed number `after`, oldest first (uses outbox_tenant_feed).

    Gap-free: feed numbers commit in order (outbox.services.outbox_mark_published), so every
    number up to the head read here is committed and visible, and a reader resuming from the
    returned position never misses one. The head is read *before* the events and bounds them:
    jumping to it past filtered-out events is safe only for numbers committed when it was read.
    An event deleted by retention is simply not there: an old position resumes at the oldest left.
    Where the outbox is partitioned, a position at or past the tenant's feed floor reads only the
    partitions from the floor's day on (outbox.services.outbox_feed_floors_set says why no later
    number is below it), and a reader at the head reads none. Raises FeedPositionAhead if `after`
    is beyond the head.
    """
    head, floor_seq, floor_key = _counter(tenant_id)
    if after > head:
        raise FeedPositionAhead(after)
    if after == head:
        return FeedPage(events=[], position=head, done=True)
    qs = OutboxEvent.objects.filter(tenant_id=tenant_id, feed_seq__gt=after, feed_seq__lte=head)
    if floor_key is not None and floor_seq is not None and after >= floor_seq:
        qs = qs.filter(event_id__gte=floor_key)
    if types:
        qs = qs.filter(event_type__in=sorted(types))
    events = list(qs.order_by("feed_seq")[:limit])
    if len(events) == limit:
        return FeedPage(events=events, position=events[-1].feed_seq, done=False)
    return FeedPage(events=events, position=head, done=True)


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
