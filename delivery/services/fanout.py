"""The fan-out: published events into notifications, one per (event × matching subscription),
the heads of their queues handed to a delivery loop's offer (docs/events.md)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.db import connection, transaction

from core.db import db_datetime, db_param, db_uuid, insert_many, rows_by_key, sql_query
from core.db.wakeups import Channel, notify
from core.ids import new_id_dated_as, utcnow
from core.partition_queries import made_since, within
from delivery.envelopes import event_body
from delivery.models import PARKED, Notification, Subscription
from delivery.partitions import NOTIFICATION_DAYS, OPEN
from delivery.services.claims import lease_length
from delivery.tries import ClaimedNotification

# The tags calls carry now, by call id: orchestration keeps them, and delivery, beside it, imports
# nothing of it, so the edge hands this reader over at start (eventservice/apps.py). Read only
# for the events of tenants with a subscription filtered by tag.
CallTags = Callable[[list[str], list[uuid.UUID]], dict[uuid.UUID, set[str]]]
_call_tags: CallTags | None = None


def call_tags_reader_set(reader: CallTags) -> None:
    global _call_tags
    _call_tags = reader


@dataclass(frozen=True)
class FanoutEvent:
    envelope: dict[str, Any]
    seq: int
    created_at: datetime


class ClaimOffer(Protocol):
    """A delivery loop's room for notifications claimed as the fan-out makes them
    (delivery.runner.Deliverer.offer): the heads of their queues go to its tries without a claim
    of their own, so a burst's first deliveries never wait for the loop's next write."""

    session: str  # the worker session the claims are made for (the watchdog's, as any claim's)

    def reserve(self, subscription: Subscription) -> bool:
        """Room for one more of this subscription's notifications (taken if there is)."""

    def take(self, claimed: list[ClaimedNotification]) -> None:
        """The claimed, once the transaction that made them committed (never before: a try of a
        row that was rolled back would be a delivery of nothing)."""


def notifications_fan_out(*, events: Sequence[FanoutEvent], offer: ClaimOffer | None = None) -> int:
    """One notification per (event × matching subscription): the event's tenant's and the
    operator-wide ones, of a matching type, created at or before the event. Disabled ones too:
    their notifications are made PARKED, out of the claims' way, and wait until the subscription
    is enabled again.
    Idempotent (the pair is unique), so a redelivered event makes nothing twice. Returns how
    many were made.

    With `offer`, the new notifications that head their (subscription, call) queue are made
    claimed for the offering loop's session, as many as it has room for, and handed to it when
    the transaction commits; the others are made due, for any loop's claim (docs/events.md,
    "Handed over at the fan-out")."""
    if not events:
        return 0
    subscriptions = _fan_out_subscriptions(sorted({event.envelope["tenantId"] for event in events}))
    if not subscriptions:
        return 0
    tags = _tags_of_calls(events, subscriptions)
    now = utcnow()
    # Each notification's id bears its event's time (core.ids.new_id_dated_as): an event's
    # notifications share the day of their partition (delivery/partitions.py), so a redelivered
    # event meets its (event, subscription) pair there, which the partition keeps unique.
    event_ids = {id(event): uuid.UUID(str(event.envelope["id"])) for event in events}
    rows = [
        {
            "notification_id": new_id_dated_as(event_ids[id(event)]),
            "subscription_id": subscription.subscription_id,
            "tenant_id": event.envelope["tenantId"],
            "event_id": event.envelope["id"],
            "event_seq": event.seq,
            "aggregate_id": event.envelope["aggregateId"],
            "event_type": event.envelope["type"],
            "envelope": event.envelope,  # the same object for each subscription: dumped once
            "event_created_at": event.created_at,
            "next_attempt_at": now if subscription.enabled else PARKED,
            "created_at": now,
            "updated_at": now,
        }
        for event in events
        for subscription in subscriptions
        if _matches(subscription, event, tags)
    ]
    # No savepoint when nested (a failure rolls back the caller's whole transaction, as every
    # caller wants): a SAVEPOINT and its RELEASE are two more statements under the write lock.
    with transaction.atomic(savepoint=False):
        handed = _hand_over(rows, offer, now) if offer is not None and rows else []
        made = insert_many(Notification, rows=rows, ignore_conflicts=True)
        if made > len(handed):  # due for any delivery loop once this commits
            notify(Channel.DELIVERY)
        if handed:
            if made != len(rows):  # a redelivered event: only the rows made now are claimed
                handed = _existing(handed)
            transaction.on_commit(functools.partial(offer.take, handed))
    return len(rows)


def _hand_over(rows: list[dict[str, Any]], offer: ClaimOffer, now: datetime) -> list[ClaimedNotification]:
    """Of `rows` (in event order), those to make claimed for `offer`, marked so: each the first
    new notification of its (subscription, call), whose queue holds no open one already, of an
    enabled subscription, while the offer has room. The others wait their turn in the queue, or
    in any loop's claim, as every notification did before."""
    subscription_ids = {row["subscription_id"] for row in rows}
    enabled = {
        subscription.subscription_id: subscription
        for subscription in rows_by_key(Subscription, keys=sorted(subscription_ids))
        if subscription.enabled
    }
    if not enabled:
        return []
    aggregates = {aggregate: uuid.UUID(str(aggregate)) for aggregate in {row["aggregate_id"] for row in rows}}
    # The queues with an open notification: their new ones wait behind it (index-only walk of
    # event_notifications_open; in the window of the open ones where the table is partitioned).
    # Compared as read: the few keys below are made in the columns' form, not each row read
    # turned back into UUIDs (a burst has many open).
    window, bounds = within(_window_of(OPEN.bounds(now=now), aggregates.values()), "{n.notification_id}")
    waiting = set(
        sql_query(
            "SELECT {n.subscription}, {n.aggregate_id} FROM {n} WHERE {n.next_attempt_at} IS NOT NULL" + window + " "
            f"AND {{n.subscription}} IN ({', '.join(['%s'] * len(enabled))}) "
            f"AND {{n.aggregate_id}} IN ({', '.join(['%s'] * len(aggregates))})",
            [*bounds, *enabled, *sorted(aggregates.values())],
            n=Notification,
        )
    )
    as_read = {key: db_param(key) for key in [*subscription_ids, *aggregates.values()]}
    lease_until = now + lease_length()
    handed: list[ClaimedNotification] = []
    bodies: dict[int, str] = {}  # by event: rows hold each event's one envelope for every subscriber
    for row in rows:
        queue = (as_read[row["subscription_id"]], as_read[aggregates[row["aggregate_id"]]])
        if queue in waiting:
            continue
        waiting.add(queue)  # this call's later events wait behind this one
        subscription = enabled.get(row["subscription_id"])
        if subscription is None or not offer.reserve(subscription):
            continue
        row.update(locked_until=lease_until, next_attempt_at=lease_until, claimed_by=offer.session or None)
        body = bodies.get(id(row["envelope"]))
        if body is None:
            body = bodies[id(row["envelope"])] = event_body(row["envelope"])
        handed.append(
            ClaimedNotification(
                pk=row["notification_id"],
                subscription=subscription,
                envelope=row["envelope"],
                body=body,
                attempts=0,
                step=0,
                manual=False,
                event_created_at=row["event_created_at"],
                lease_until=lease_until,
                claimed_by=offer.session,
            )
        )
    return handed


def _window_of(bounds: tuple[Any, Any] | None, calls: Iterable[uuid.UUID]) -> tuple[Any, Any] | None:
    """The window of the open notifications, from the day of the oldest of `calls` if that is
    earlier (a late fan-out: a call's notifications are never older than the call)."""
    if bounds is None:
        return None
    lower = bounds[0]
    for call in calls:
        since = made_since(NOTIFICATION_DAYS, call)
        if since is None:
            return None
        lower = min(lower, since)
    return lower, bounds[1]


def _existing(claimed: list[ClaimedNotification]) -> list[ClaimedNotification]:
    """Those of `claimed` whose row exists (was made now, not skipped as a redelivered pair)."""
    keys = {
        db_uuid(pk)
        for (pk,) in sql_query(
            f"SELECT {{n.notification_id}} FROM {{n}} WHERE {{n.notification_id}} IN ({', '.join(['%s'] * len(claimed))})",
            [notification.pk for notification in claimed],
            n=Notification,
        )
    }
    return [notification for notification in claimed if notification.pk in keys]


@dataclass(frozen=True, slots=True)
class _Target:
    """What the fan-out reads of a subscription."""

    subscription_id: uuid.UUID
    tenant_id: str | None
    event_types: list[str]
    created_at: datetime
    tags: frozenset[str]
    enabled: bool


def _fan_out_subscriptions(tenant_ids: list[str]) -> list[_Target]:
    """The subscriptions of `tenant_ids` and the operator-wide ones: the ORM's
    `filter(Q(tenant_id__in=...) | Q(tenant__isnull=True))`, written once per process
    (core.db.sql_query), as the dispatcher runs it for every batch inside its write transaction."""
    keys = ", ".join(["%s"] * len(tenant_ids))
    event_types = Subscription._meta.get_field("event_types")
    return [
        _Target(
            db_uuid(pk),
            tenant_id,
            event_types.from_db_value(types, None, connection),
            db_datetime(created_at),
            frozenset(event_types.from_db_value(tags, None, connection) or ()),
            bool(enabled),
        )
        for pk, tenant_id, types, created_at, tags, enabled in sql_query(
            "SELECT {s.subscription_id}, {s.tenant}, {s.event_types}, {s.created_at}, {s.tags}, {s.enabled} FROM {s} "
            f"WHERE {{s.tenant}} IN ({keys}) OR {{s.tenant}} IS NULL ORDER BY {{s.created_at}}, {{s.subscription_id}}",
            tenant_ids,
            s=Subscription,
        )
    ]


def _tags_of_calls(events: Sequence[FanoutEvent], subscriptions: list[_Target]) -> dict[uuid.UUID, set[str]]:
    """The tags of the calls whose events a subscription filtered by tag may take: none read
    when no subscription is (one query otherwise)."""
    filtered = {subscription.tenant_id for subscription in subscriptions if subscription.tags}
    if not filtered or _call_tags is None:
        return {}
    taken = [event for event in events if None in filtered or event.envelope["tenantId"] in filtered]
    if not taken:
        return {}
    tenants = sorted({event.envelope["tenantId"] for event in taken})
    return _call_tags(tenants, sorted({uuid.UUID(str(event.envelope["aggregateId"])) for event in taken}))


def _matches(subscription: _Target, event: FanoutEvent, tags: dict[uuid.UUID, set[str]]) -> bool:
    if subscription.tenant_id is not None and subscription.tenant_id != event.envelope["tenantId"]:
        return False
    if subscription.event_types and event.envelope["type"] not in subscription.event_types:
        return False
    if subscription.tags and subscription.tags.isdisjoint(tags.get(uuid.UUID(str(event.envelope["aggregateId"])), ())):
        return False  # not a call carrying one of its tags (an event of no call carries none)
    return subscription.created_at <= event.created_at
