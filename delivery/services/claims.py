"""The delivery loop's claims: due notifications leased to a worker session, given back when
not tried or when their session is found dead (docs/events.md)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from core.db import db_datetime, db_uuid, rows_by_key, sql_query, sql_update_returning
from core.db.wakeups import Channel, notify
from core.fairness import ShareRule, round_robin
from core.ids import utcnow
from core.partition_queries import made_since, within
from delivery.envelopes import event_body
from delivery.models import Notification, Subscription
from delivery.partitions import NOTIFICATION_DAYS, OPEN
from delivery.tries import ClaimedNotification

# A delivery loop's claim on a notification, at least (see `lease_length`).
LEASE = timedelta(seconds=60)


def longest_try_ms() -> int:
    """The longest one try may take: a webhook's timeout, or a NATS batch's bound (twice the
    publish timeout, delivery/nats.py)."""
    return max(settings.WEBHOOK_TIMEOUT_MS, 2 * settings.NATS_PUBLISH_TIMEOUT_MS)


def lease_length() -> timedelta:
    """How long a claim holds a notification: LEASE, or longer where the timeouts ask for it.
    A loop claims DELIVERY_CLAIM_AHEAD times as many as it tries at once, so a claimed try may
    wait for DELIVERY_CLAIM_AHEAD - 1 tries of its subscription before it starts, then last its
    own: the lease covers that with one more try's room, and a try that waited longer is not
    started (another loop may claim it once the lease ends, and must not find it out twice). A
    worker found dead gives its claims back sooner (notifications_release_dead_claims)."""
    return max(LEASE, timedelta(milliseconds=(settings.DELIVERY_CLAIM_AHEAD + 1) * longest_try_ms()))


def notifications_claim(
    *,
    limit: int,
    now: datetime | None = None,
    in_flight: Mapping[uuid.UUID, int] | None = None,
    per_subscription: int | None = None,
    tenant_in_flight: Mapping[str, int] | None = None,
    tenant_share: ShareRule | None = None,
    free: int = 0,
    claimed_by: str = "",
) -> list[ClaimedNotification]:
    """Claim due notifications of enabled subscriptions, at most `limit`, for the worker
    session `claimed_by` (whose claims the watchdog gives back should it die).

    Only the head of each (subscription, call) queue can be due: a notification with an earlier
    open one of the same call and subscription is never considered, so a later event waits
    behind an earlier one that has neither succeeded nor expired, and nothing else waits
    (docs/events.md, "In order per call and subscriber"). With `per_subscription`, a
    subscription never has more than that many tries in flight (`in_flight` counts this loop's),
    so one slow receiver holds a few threads, never all of them; with `tenant_share`, a tenant's
    subscriptions together take of the `free` room what their share allows (`tenant_in_flight`
    they hold; operator-wide subscriptions count for no tenant), and the tenants take turns among
    the due (docs/events.md, "Fair shares").

    Inside a caller's transaction (the delivery loop records and claims in one) it takes no
    savepoint: a failure rolls back the caller's whole transaction, as the loop wants."""
    now = now or utcnow()
    in_flight = in_flight or {}
    tenant_in_flight = tenant_in_flight or {}
    full = [sub for sub, n in in_flight.items() if per_subscription is not None and n >= per_subscription]
    full_tenants = [t for t, n in tenant_in_flight.items() if tenant_share and not tenant_share.room_for(n, free)]
    with transaction.atomic(savepoint=False):
        # Keys first (a few candidates per place, for the per-subscription cap), whole rows only
        # for the chosen: an envelope is decoded once per try, not once per look.
        due = _due_rows(now=now, excluded=full, excluded_tenants=full_tenants, limit=limit * 4)
        if tenant_share is not None:
            due = round_robin(due, key=itemgetter(2))
        # Keys as the database gives them: only the chosen become UUIDs, and the few distinct
        # subscriptions once each (converting every candidate was a tenth of a claim).
        subscription_ids: dict[Any, uuid.UUID] = {}
        chosen: list[Any] = []
        taken: Counter[uuid.UUID] = Counter()
        tenant_taken: Counter[str] = Counter()
        for pk, raw_sub, tenant in due:
            if raw_sub not in subscription_ids:
                subscription_ids[raw_sub] = db_uuid(raw_sub)
            sub = subscription_ids[raw_sub]
            if per_subscription is not None and in_flight.get(sub, 0) + taken[sub] >= per_subscription:
                continue
            if (
                tenant is not None
                and tenant_share is not None
                and not tenant_share.room_for(
                    tenant_in_flight.get(tenant, 0) + tenant_taken[tenant], free - len(chosen)
                )
            ):
                continue
            taken[sub] += 1
            if tenant is not None:
                tenant_taken[tenant] += 1
            chosen.append(pk)
            if len(chosen) == limit:
                break
        if not chosen:
            return []
        lease_until = now + lease_length()
        rows = _leased(chosen, lease=lease_until, claimed_by=claimed_by)
        subscriptions = {
            row.pk: row for row in rows_by_key(Subscription, keys=sorted({subscription_ids[row[1]] for row in rows}))
        }
    envelope = Notification._meta.get_field("envelope")
    # An event's notifications to several subscribers are claimed together: its envelope is
    # decoded, and its body made, once for all of them.
    read: dict[Any, tuple[dict[str, Any], str]] = {}

    def envelope_and_body(payload: Any) -> tuple[dict[str, Any], str]:
        key = payload if isinstance(payload, str | bytes) else id(payload)
        if key not in read:
            decoded = envelope.from_db_value(payload, None, connection)
            read[key] = (decoded, event_body(decoded))
        return read[key]

    claimed = {}
    for pk, subscription_id, payload, attempts, step, manual, event_created_at in rows:
        decoded, body = envelope_and_body(payload)
        claimed[pk] = ClaimedNotification(
            pk=db_uuid(pk),
            subscription=subscriptions[subscription_ids[subscription_id]],
            envelope=decoded,
            body=body,
            attempts=attempts,
            step=step,
            manual=bool(manual),
            event_created_at=db_datetime(event_created_at),
            lease_until=lease_until,
            claimed_by=claimed_by,
        )
    # In the order chosen (due first), which the loop hands to its threads.
    return [claimed[pk] for pk in chosen]


def _leased(keys: list[Any], *, lease: datetime, claimed_by: str) -> list[tuple[Any, ...]]:
    """Lease `keys` until `lease` to the session `claimed_by`, with the next try at its end: a
    claimed notification leaves the due range of the index, so the next claims do not walk over
    the tries in flight (if this one never comes back, it is due again when its lease ends, or
    when the watchdog gives it back). Returns what a try and its recording read of each
    (delivery/channels/, notifications_record), in one statement where the database can
    (core.db.sql_update_returning)."""
    return sql_update_returning(
        Notification,
        assign="{t.locked_until} = %s, {t.next_attempt_at} = %s, {t.claimed_by} = %s",
        params=[lease, lease, claimed_by or None],
        keys=keys,
        returning="{t.notification_id}, {t.subscription}, {t.envelope}, {t.attempts}, {t.step}, {t.manual}, "
        "{t.event_created_at}",
    )


def _due_rows(
    *, now: datetime, excluded: Sequence[uuid.UUID], excluded_tenants: Sequence[str] = (), limit: int
) -> list[tuple[Any, Any, str | None]]:
    """(notification_id, subscription_id, the subscription's tenant_id), as the database gives
    them (core.db.db_uuid makes UUIDs of them), of due notifications of enabled subscriptions
    (not of `excluded`, nor of `excluded_tenants`) that head their (subscription, call) queue,
    due first, at most `limit`; locked for the caller's transaction, skipping rows another holds
    (PostgreSQL). The same rows as the ORM's

        Notification.objects.filter(Q(locked_until__isnull=True) | Q(locked_until__lte=now),
            next_attempt_at__lte=now, subscription__enabled=True)
        .exclude(subscription_id__in=excluded).filter(~Exists(earlier_open))
        .select_for_update(skip_locked=True, of=("self",))
        .order_by("next_attempt_at", "event_seq").values_list("pk", "subscription_id")[:limit]

    with `earlier_open` an open notification of the same subscription and call with a lower
    event_seq, but written once per process: the ORM compiled it on every claim, which cost a
    delivery loop more than the database's work. It walks event_notifications_due_seq in order
    (tests/delivery/test_plans.py)."""
    not_excluded = f" AND n.{{n.subscription}} NOT IN ({', '.join(['%s'] * len(excluded))})" if excluded else ""
    if excluded_tenants:
        not_excluded += (
            f" AND (s.{{s.tenant}} IS NULL OR s.{{s.tenant}} NOT IN ({', '.join(['%s'] * len(excluded_tenants))}))"
        )
    lock = " FOR UPDATE OF n SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
    # Where the table is partitioned, both the due and the earlier open ones are sought in the
    # window of the open notifications (delivery/partitions.py). A notification's id bears its
    # event's time, never older than its call's: for a call made within the window, that is
    # every notification of it; for an older call (rare: a late fan-out, a resend), the earlier
    # open ones are looked for again from the call's day (_without_earlier_open).
    bounds = OPEN.bounds(now=now)
    window, window_params = within(bounds, "n.{n.notification_id}")
    earlier_window, _ = within(bounds, "e.{n.notification_id}")
    also = ", n.{n.aggregate_id}, n.{n.event_seq}" if bounds is not None else ""
    rows = sql_query(
        "SELECT n.{n.notification_id}, n.{n.subscription}, s.{s.tenant}" + also + " FROM {n} n "
        "INNER JOIN {s} s ON (n.{n.subscription} = s.{s.subscription_id}) "
        "WHERE (n.{n.locked_until} IS NULL OR n.{n.locked_until} <= %s) AND n.{n.next_attempt_at} <= %s"
        + window
        + " AND s.{s.enabled}"
        + not_excluded
        + " AND NOT EXISTS (SELECT 1 FROM {n} e "
        "WHERE e.{n.subscription} = n.{n.subscription} AND e.{n.aggregate_id} = n.{n.aggregate_id} "
        "AND e.{n.next_attempt_at} IS NOT NULL AND e.{n.event_seq} < n.{n.event_seq}" + earlier_window + ") "
        "ORDER BY n.{n.next_attempt_at}, n.{n.event_seq} LIMIT %s" + lock,
        [now, now, *window_params, *excluded, *excluded_tenants, *window_params, limit],
        n=Notification,
        s=Subscription,
    )
    if bounds is None:
        return rows
    return _without_earlier_open(rows, floor=bounds[0])


def _without_earlier_open(rows: list[tuple[Any, ...]], *, floor: Any) -> list[tuple[Any, Any, str | None]]:
    """Of `rows` (with their call and event_seq), those with no earlier open notification of
    their call and subscription, looked for from the call's day where the call is older than
    the window's `floor`; each as (notification_id, subscription_id, tenant_id)."""
    kept = []
    for pk, subscription, tenant, aggregate, seq in rows:
        since = made_since(NOTIFICATION_DAYS, db_uuid(aggregate))
        if since is None or since < floor:
            bound, params = (" AND {n.notification_id} >= %s", [since]) if since is not None else ("", [])
            if sql_query(
                "SELECT 1 FROM {n} WHERE {n.subscription} = %s AND {n.aggregate_id} = %s "
                "AND {n.next_attempt_at} IS NOT NULL AND {n.event_seq} < %s" + bound + " LIMIT 1",
                [subscription, aggregate, seq, *params],
                n=Notification,
            ):
                continue
        kept.append((pk, subscription, tenant))
    return kept


def notifications_release(*, notifications: Sequence[ClaimedNotification | Notification]) -> None:
    """Give back claims that were not tried (the loop is stopping): due again at once. Only
    claims still held as they were made: one the watchdog gave back meanwhile may be another
    loop's now, and one finished meanwhile must not be reopened."""
    by_holder: dict[str | None, list[Any]] = {}
    for notification in notifications:
        by_holder.setdefault(notification.claimed_by or None, []).append(notification.pk)
    now = utcnow()
    with transaction.atomic():
        for claimed_by, keys in by_holder.items():
            Notification.objects.filter(pk__in=keys, claimed_by=claimed_by, next_attempt_at__isnull=False).update(
                locked_until=None, claimed_by=None, next_attempt_at=now
            )
        notify(Channel.DELIVERY)


def notifications_release_dead_claims(*, live_sessions: Iterable[str], looked_at: datetime) -> int:
    """Give back the claims of worker sessions that were not in `live_sessions` at `looked_at`
    (killed, or stalled until the watchdog declared them dead). Claims made after `looked_at`
    (by a session started since) are not judged; claims made outside a worker (no session)
    keep their lease. Returns how many.

    Each is due again once no try of the dead session can still be out: a session starts no
    try once its last heartbeat is half of WORKER_STALE_SECONDS old (workers.keeper.
    SessionKeeper.surely_alive), so a session declared dead at `looked_at` started its last
    try before then, and that try is over by `looked_at` + the longest try. As with the lease,
    no notification is ever out twice at once, nor a call's next event before this one's
    first arrival: only sooner than the lease. A try given back may have been sent; sending it
    again is the at-least-once the lease gives too, and the receiver de-duplicates it by the
    event id. Rows a recording holds locked now (PostgreSQL) are left to the next pass."""
    due = looked_at + timedelta(milliseconds=longest_try_ms())
    with transaction.atomic():
        # Held claims only (a recorded try clears its lease), along event_notifications_claimed:
        # the watchdog runs this every pass, and the open notifications of a burst are many.
        held = Notification.objects.filter(
            locked_until__gt=looked_at,
            locked_until__lte=looked_at + lease_length(),  # claimed at `looked_at` or before
            claimed_by__isnull=False,
        )
        # A claim is open (its next try is its lease's end): in the window of the open ones.
        bounds = OPEN.bounds(now=looked_at)
        if bounds is not None:
            held = held.filter(notification_id__gte=bounds[0], notification_id__lt=bounds[1])
        held = (
            held.exclude(claimed_by__in=list(live_sessions))
            .select_for_update(skip_locked=True)  # never waits, so never deadlocks
            .order_by()
        )
        keys = list(held.values_list("pk", flat=True))
        if not keys:
            return 0
        return Notification.objects.filter(pk__in=keys).update(
            locked_until=None, claimed_by=None, next_attempt_at=due, updated_at=utcnow()
        )
