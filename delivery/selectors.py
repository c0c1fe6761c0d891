"""Reads of the delivery module."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, F, Min, Prefetch, QuerySet

from core.db import db_datetime, sql_query
from core.errors import NotFound
from core.ids import utcnow
from core.partition_queries import CLOCK_MARGIN, made_since, within
from core.partitions import is_partitioned
from delivery.models import PARKED, DeliveryAttempt, Notification, Subscription
from delivery.partitions import NOTIFICATION_DAYS, OPEN

OPEN_STATES = (Notification.State.PENDING, Notification.State.FAILED)


def notifications_due_exist(*, now: datetime | None = None) -> bool:
    """Whether any notification of an enabled subscription is due (a plain read: an idle loop
    polls often and must not take SQLite's write lock to find nothing). Uses
    event_notifications_due_seq, in the window of the open notifications where the table is
    partitioned (delivery/partitions.py). Written once per process (core.db.sql_query): every
    worker process asks 20 times a second."""
    now = now or utcnow()
    window, bounds = within(OPEN.bounds(now=now), "n.{n.notification_id}")
    return bool(
        sql_query(
            "SELECT 1 FROM {n} n INNER JOIN {s} s ON (n.{n.subscription} = s.{s.subscription_id}) "
            "WHERE (n.{n.locked_until} IS NULL OR n.{n.locked_until} <= %s) "
            f"AND n.{{n.state}} IN ({', '.join(['%s'] * len(OPEN_STATES))}) "
            "AND n.{n.next_attempt_at} <= %s" + window + " AND s.{s.enabled} LIMIT 1",
            [now, *(state.value for state in OPEN_STATES), now, *bounds],
            n=Notification,
            s=Subscription,
        )
    )


def notifications_next_due(*, now: datetime | None = None) -> datetime | None:
    """When the first open notification of an enabled subscription that no try holds is due
    (at or before `now`: due now); None when there is none. The delivery loop's look while
    the wake-ups listen: it finds what is due now, and else how long it may sleep before a
    retry falls due by the clock (docs/architecture.md, "Wake, don't poll"). Along
    event_notifications_due_seq, in its order, in the window of the open notifications where the
    table is partitioned (delivery/partitions.py), and short of the PARKED ones: a disabled
    subscription's notifications wait at the index's end, one more per event, and this look
    walked over all of them whenever nothing was due (bench/HISTORY.md, "The next-due look stops
    short of the parked notifications")."""
    now = now or utcnow()
    window, bounds = within(OPEN.bounds(now=now), "n.{n.notification_id}")
    rows = sql_query(
        "SELECT n.{n.next_attempt_at} FROM {n} n INNER JOIN {s} s ON (n.{n.subscription} = s.{s.subscription_id}) "
        "WHERE (n.{n.locked_until} IS NULL OR n.{n.locked_until} <= %s) "
        f"AND n.{{n.state}} IN ({', '.join(['%s'] * len(OPEN_STATES))}) AND n.{{n.next_attempt_at}} < %s"
        + window
        + " AND s.{s.enabled} ORDER BY n.{n.next_attempt_at} LIMIT 1",
        [now, *(state.value for state in OPEN_STATES), PARKED, *bounds],
        n=Notification,
        s=Subscription,
    )
    return db_datetime(rows[0][0]) if rows else None


# --- Subscriptions and their deliveries, as a tenant sees them (API, commands) --------------------

# Delivery lag is measured over the notifications delivered this recently (docs/events.md).
LAG_WINDOW = timedelta(hours=1)
# At most this many of a subscription's newest deliveries make its lag percentiles.
LAG_SAMPLE = 10_000
_ATTEMPTS_IN_ORDER = Prefetch("delivery_attempts", queryset=DeliveryAttempt.objects.order_by("n"))


def _uuid(raw: uuid.UUID | str) -> uuid.UUID | None:
    if isinstance(raw, uuid.UUID):
        return raw
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        return None


def subscriptions_for_tenant(*, tenant_id: str) -> QuerySet[Subscription]:
    """The tenant's own subscriptions; the operator-wide ones (tenant null) are the operator's."""
    return Subscription.objects.filter(tenant_id=tenant_id)


def subscription_get(*, tenant_id: str, subscription_id: uuid.UUID | str) -> Subscription:
    """One of the tenant's own subscriptions; NotFound for anything else (a malformed id too)."""
    pk = _uuid(subscription_id)
    subscription = subscriptions_for_tenant(tenant_id=tenant_id).filter(pk=pk).first() if pk else None
    if subscription is None:
        raise NotFound(f"Subscription {subscription_id} not found.")
    return subscription


def notification_get(*, tenant_id: str, notification_id: uuid.UUID | str) -> Notification:
    """A notification of one of the tenant's own subscriptions, with its attempts; NotFound else."""
    pk = _uuid(notification_id)
    notification = (
        Notification.objects.filter(pk=pk, subscription__tenant_id=tenant_id)
        .prefetch_related(_ATTEMPTS_IN_ORDER)
        .first()
        if pk
        else None
    )
    if notification is None:
        raise NotFound(f"Delivery {notification_id} not found.")
    return notification


@dataclass(frozen=True)
class SubscriptionFigures:
    """Open notifications (PENDING or FAILED), and the delivery lag (delivered_at − the event's
    time) of the SUCCEEDED ones delivered within LAG_WINDOW: p50, p99 and how many they were."""

    pending: int = 0
    lag_p50_ms: int | None = None
    lag_p99_ms: int | None = None
    lag_sample: int = 0


def subscription_figures(
    *, subscription_ids: Collection[uuid.UUID], now: datetime | None = None
) -> dict[uuid.UUID, SubscriptionFigures]:
    """The figures of each subscription (an absent one has none yet). One query counts the open
    notifications of all (event_notifications_open); one per subscription reads its lags."""
    ids = list(subscription_ids)
    if not ids:
        return {}
    now = now or utcnow()
    pending = dict(
        Notification.objects.filter(subscription_id__in=ids, state__in=OPEN_STATES)
        .order_by()
        .values("subscription_id")
        .annotate(n=Count("pk"))
        .values_list("subscription_id", "n")
    )
    figures = {}
    for subscription_id in ids:
        lags = [
            lag.total_seconds() * 1000
            for lag in Notification.objects.filter(
                subscription_id=subscription_id,
                state=Notification.State.SUCCEEDED,
                delivered_at__gte=now - LAG_WINDOW,
            )
            .order_by("-delivered_at")
            .annotate(lag=F("delivered_at") - F("event_created_at"))
            .values_list("lag", flat=True)[:LAG_SAMPLE]
            if lag is not None
        ]
        figures[subscription_id] = SubscriptionFigures(
            pending=pending.get(subscription_id, 0),
            lag_p50_ms=_percentile_ms(lags, 0.5),
            lag_p99_ms=_percentile_ms(lags, 0.99),
            lag_sample=len(lags),
        )
    return figures


def _percentile_ms(values: list[float], fraction: float) -> int | None:
    """Nearest-rank percentile, as outbox.selectors computes the outbox lag."""
    if not values:
        return None
    ordered = sorted(values)
    return max(0, round(ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]))


def notifications_for_subscription(*, subscription: Subscription, state: str | None = None) -> QuerySet[Notification]:
    """A subscription's notifications (optionally in one state) with their attempts; the caller
    orders and pages them (event_notifications_sub_new; the API by id, newest first)."""
    rows = Notification.objects.filter(subscription=subscription).defer("envelope")
    if is_partitioned(NOTIFICATION_DAYS.table):
        # Only the days since the subscription was made: it is given the events made since
        # (delivery.services.fanout), and a notification's id bears its event's time.
        rows = rows.filter(notification_id__gte=NOTIFICATION_DAYS.key_at(subscription.created_at - CLOCK_MARGIN))
    if state is not None:
        rows = rows.filter(state=state)
    return rows.prefetch_related(_ATTEMPTS_IN_ORDER)


def deliveries_for_call(*, tenant_id: str, service_call_id: uuid.UUID | str) -> dict[uuid.UUID, list[Notification]]:
    """The notifications of a call's events to the tenant's own subscriptions, by event id, in
    one query (event_notifications_call). Operator-wide subscriptions' notifications are left
    out: those are the operator's."""
    by_event: dict[uuid.UUID, list[Notification]] = {}
    rows = Notification.objects.filter(
        tenant_id=tenant_id, aggregate_id=service_call_id, subscription__tenant_id=tenant_id
    )
    # Where the table is partitioned, only the days from the call's (its id, a UUID v7, says
    # when): a notification's id bears its event's time, never older than the call.
    since = made_since(NOTIFICATION_DAYS, service_call_id)
    if since is not None:
        rows = rows.filter(notification_id__gte=since)
    rows = (
        rows.select_related("subscription")
        .only(
            "notification_id",
            "event_id",
            "event_seq",
            "state",
            "attempts",
            "next_attempt_at",
            "delivered_at",
            "subscription",
            "subscription__subscription_id",
            "subscription__name",
            "subscription__created_at",
        )
        .order_by("event_seq", "subscription__created_at", "subscription_id")
    )
    for notification in rows:
        by_event.setdefault(notification.event_id, []).append(notification)
    return by_event


def open_counts(*, subscription_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, int]:
    """Open notifications (PENDING or FAILED) per subscription, in one query (the dashboard's
    list; event_notifications_open). An absent subscription has none."""
    ids = list(subscription_ids)
    if not ids:
        return {}
    return dict(
        Notification.objects.filter(subscription_id__in=ids, state__in=OPEN_STATES)
        .order_by()
        .values("subscription_id")
        .annotate(n=Count("pk"))
        .values_list("subscription_id", "n")
    )


# --- Backlog and lag per sink kind (system page, /metrics): counts only, no tenant data -------

# At most this many of a kind's newest notifications make its lag percentiles at a scrape.
KIND_LAG_SAMPLE = 2000


@dataclass(frozen=True)
class KindBacklog:
    """A sink kind's open notifications: PENDING (not tried yet, or requeued), FAILED (to be
    tried again), and how long the oldest PENDING one has waited since the fan-out."""

    pending: int = 0
    failing: int = 0
    oldest_pending_age_s: float | None = None


def delivery_backlog(
    *, now: datetime | None = None, tenant_ids: Collection[str] | None = None
) -> dict[str, KindBacklog]:
    """The open notifications per subscription kind (every kind present), of the events of
    `tenant_ids` (None: all tenants). One grouped query over the rows of the partial index
    event_notifications_due_seq: as large as the backlog, not as the table."""
    now = now or utcnow()
    rows = Notification.objects.filter(next_attempt_at__isnull=False)  # open (uses event_notifications_due_seq)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=list(tenant_ids))
    counts: dict[tuple[str, str], tuple[int, datetime | None]] = {
        (kind, state): (n, oldest)
        for kind, state, n, oldest in rows.order_by()
        .values("subscription__kind", "state")
        .annotate(n=Count("pk"), oldest=Min("created_at"))
        .values_list("subscription__kind", "state", "n", "oldest")
    }
    backlog = {}
    for kind in Subscription.Kind.values:
        pending, oldest = counts.get((kind, Notification.State.PENDING), (0, None))
        failing, _ = counts.get((kind, Notification.State.FAILED), (0, None))
        backlog[kind] = KindBacklog(
            pending=pending,
            failing=failing,
            oldest_pending_age_s=max(0.0, (now - oldest).total_seconds()) if oldest else None,
        )
    return backlog


def expired_counts() -> dict[str, int]:
    """EXPIRED notifications per subscription kind (every kind present): the partial index
    event_notifications_expired holds only those."""
    counts = dict(
        Notification.objects.filter(state=Notification.State.EXPIRED)
        .order_by()
        .values("subscription__kind")
        .annotate(n=Count("pk"))
        .values_list("subscription__kind", "n")
    )
    return {kind: counts.get(kind, 0) for kind in Subscription.Kind.values}


@dataclass(frozen=True)
class KindLag:
    """Delivery lag (the event's time → delivered) of a kind's notifications made within
    LAG_WINDOW, in seconds. One not delivered yet counts with its age so far (a lower bound),
    so a stalled sink raises p99 instead of dropping out of it."""

    p50_s: float | None = None
    p99_s: float | None = None
    sample: int = 0


def delivery_lag_by_kind(*, now: datetime | None = None) -> dict[str, KindLag]:
    """KindLag of each kind: one query per kind, over its subscriptions' newest notifications
    (event_notifications_sub_new: subscription, then created_at within the window)."""
    now = now or utcnow()
    lags = {}
    for kind in Subscription.Kind.values:
        rows = (
            Notification.objects.filter(subscription__kind=kind, created_at__gte=now - LAG_WINDOW)
            .order_by("-created_at")
            .values_list("event_created_at", "delivered_at", "state")[:KIND_LAG_SAMPLE]
        )
        seconds = [
            ((delivered if state == Notification.State.SUCCEEDED and delivered else now) - event_at).total_seconds()
            for event_at, delivered, state in rows
        ]
        lags[kind] = KindLag(p50_s=_percentile_s(seconds, 0.5), p99_s=_percentile_s(seconds, 0.99), sample=len(seconds))
    return lags


def _percentile_s(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of _percentile_ms, in seconds and not rounded."""
    if not values:
        return None
    ordered = sorted(values)
    return max(0.0, ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))])
