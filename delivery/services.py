"""Writes of the delivery module: subscriptions, the fan-out of events into notifications, and
each notification's state as it is tried (docs/events.md)."""

from __future__ import annotations

import base64
import functools
import logging
import random
import secrets
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any, Protocol

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q

from core.db import (
    db_datetime,
    db_param,
    db_uuid,
    insert_many,
    rows_by_key,
    sql_execute_many,
    sql_query,
    sql_update_returning,
)
from core.errors import NotFound, ValidationFailed
from core.fairness import round_robin
from core.ids import new_id, utcnow
from core.secrets import seal_value
from delivery.envelopes import event_body
from delivery.models import DeliveryAttempt, Notification, Subscription
from delivery.validation import SubscriptionInput
from tenants.models import Tenant
from tenants.selectors import tenant_ceilings_get

logger = logging.getLogger("serviceagent.delivery")

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


# The previous secret keeps signing this long after a rotation (receivers roll their config).
ROTATION_OVERLAP = timedelta(hours=24)
PING_TYPE = "ServiceAgentPing"
# A subscription disabled by the receiver itself.
GONE_REASON = "the endpoint answered 410 Gone"
# A subscription whose URL the egress policy refused is disabled with this reason and the
# refusal's own message (which names the class of the address, never the address).
REFUSED_REASON = "its URL is refused by the egress policy"


def new_webhook_secret() -> str:
    """`whsec_` + base64 of 32 random bytes (Standard Webhooks)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


# --- Subscriptions ------------------------------------------------------------------------


def subscription_create(*, tenant_id: str | None, data: SubscriptionInput) -> tuple[Subscription, str | None]:
    """A subscription (webhook: with a new secret, returned once and stored sealed). A tenant has
    at most its `subscriptions` ceiling (docs/flow-control.md,
    "Operator ceilings"); operator-wide ones are not limited."""
    now = utcnow()
    secret = new_webhook_secret() if data.kind == Subscription.Kind.WEBHOOK else None
    with transaction.atomic():
        if tenant_id is not None:
            # The tenant's row, locked: two creates never both take the last place.
            list(Tenant.objects.select_for_update().filter(pk=tenant_id).values_list("pk", flat=True))
            limit = tenant_ceilings_get(tenant_id=tenant_id).subscriptions
            if Subscription.objects.filter(tenant_id=tenant_id).count() >= limit:
                raise ValidationFailed(
                    {
                        "body": [
                            f"A tenant may have at most {limit} subscriptions (the operator's ceiling for this "
                            "tenant): delete one first."
                        ]
                    }
                )
        subscription = Subscription.objects.create(
            subscription_id=new_id(),
            tenant_id=tenant_id,
            kind=data.kind,
            name=data.name,
            url=data.url or "",
            subject_template=data.subject_template or "",
            event_types=list(data.event_types or []),
            enabled=True if data.enabled is None else data.enabled,
            secret=seal_value(secret) if secret else None,
            created_at=now,
            updated_at=now,
        )
    return subscription, secret


def _subscription(tenant_id: str | None, subscription_id: uuid.UUID | str) -> Subscription:
    rows = Subscription.objects.filter(pk=subscription_id)
    rows = rows.filter(tenant__isnull=True) if tenant_id is None else rows.filter(tenant_id=tenant_id)
    subscription = rows.select_for_update().first()
    if subscription is None:
        raise NotFound(f"Subscription {subscription_id} not found.")
    return subscription


def subscription_update(
    *, tenant_id: str | None, subscription_id: uuid.UUID | str, data: SubscriptionInput
) -> Subscription:
    """Change what `data` names (None: unchanged). Enabling clears the disabled reason and the
    failing streak; what failed meanwhile stays FAILED/EXPIRED until `subscription_recover`.
    The notifications that waited while it was disabled are delivered, except those of events
    older than EVENT_DELIVERY_EXPIRY: they are EXPIRED (recoverable like any other)."""
    with transaction.atomic():
        subscription = _subscription(tenant_id, subscription_id)
        if data.url is not None and subscription.kind != Subscription.Kind.WEBHOOK:
            raise ValidationFailed({"url": ["Only webhook subscriptions have a URL."]})
        if data.subject_template is not None and subscription.kind != Subscription.Kind.NATS:
            raise ValidationFailed({"subjectTemplate": ["Only NATS subscriptions have a subject template."]})
        for field in ("name", "url", "subject_template", "event_types"):
            value = getattr(data, field)
            if value is not None:
                setattr(subscription, field, list(value) if field == "event_types" else value)
        if data.enabled is not None and data.enabled != subscription.enabled:
            subscription.enabled = data.enabled
            if data.enabled:
                subscription.disabled_reason = ""
                subscription.failing_since = None
                _expire_waiting(subscription)
            else:
                subscription.disabled_reason = "disabled by a user"
        subscription.updated_at = utcnow()
        subscription.save()
    return subscription


# The last error of a notification that waited too long for its subscription to be enabled.
EXPIRED_WHILE_DISABLED = "expired while the subscription was disabled"


def _expire_waiting(subscription: Subscription) -> int:
    """EXPIRE the open notifications of `subscription` whose event is older than the delivery
    expiry (none is out on a try: a disabled subscription's are not claimed, and a lease still
    running is left to its result). Returns how many."""
    now = utcnow()
    return (
        Notification.objects.filter(
            subscription=subscription,
            next_attempt_at__isnull=False,  # open: PENDING or FAILED
            event_created_at__lt=now - timedelta(seconds=settings.EVENT_DELIVERY_EXPIRY),
        )
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lte=now))
        .update(
            state=Notification.State.EXPIRED,
            next_attempt_at=None,
            locked_until=None,
            claimed_by=None,
            last_error=EXPIRED_WHILE_DISABLED,
            updated_at=now,
        )
    )


def subscription_delete(*, tenant_id: str | None, subscription_id: uuid.UUID | str) -> None:
    """Delete it with its notifications and attempts (nothing more is sent to it)."""
    with transaction.atomic():
        _subscription(tenant_id, subscription_id).delete()


def subscription_rotate_secret(*, tenant_id: str | None, subscription_id: uuid.UUID | str) -> tuple[Subscription, str]:
    """A new signing secret (returned once); the old one keeps signing for ROTATION_OVERLAP."""
    with transaction.atomic():
        subscription = _subscription(tenant_id, subscription_id)
        if subscription.kind != Subscription.Kind.WEBHOOK:
            raise ValidationFailed({"kind": ["Only webhook subscriptions have a signing secret."]})
        secret = new_webhook_secret()
        now = utcnow()
        subscription.previous_secret = subscription.secret
        subscription.previous_secret_until = now + ROTATION_OVERLAP
        subscription.secret = seal_value(secret)
        subscription.updated_at = now
        subscription.save()
    return subscription, secret


def subscription_send_test(*, tenant_id: str | None, subscription_id: uuid.UUID | str) -> Notification:
    """A `ServiceAgentPing` event for this subscription alone, delivered by the loop now."""
    with transaction.atomic():
        subscription = _subscription(tenant_id, subscription_id)
        now = utcnow()
        event_id, aggregate_id = new_id(), new_id()
        envelope = {
            "id": str(event_id),
            "type": PING_TYPE,
            "tenantId": subscription.tenant_id,
            "aggregateId": str(aggregate_id),
            "timestampMs": int(now.timestamp() * 1000),
            "correlationId": str(event_id),
            "causationId": None,
            "payload": {"subscriptionId": str(subscription.subscription_id), "message": "A test event."},
        }
        return Notification.objects.create(
            notification_id=new_id(),
            subscription=subscription,
            tenant_id=subscription.tenant_id or "",
            event_id=event_id,
            event_seq=0,
            aggregate_id=aggregate_id,
            event_type=PING_TYPE,
            envelope=envelope,
            event_created_at=now,
            next_attempt_at=now,
            manual=True,
            created_at=now,
            updated_at=now,
        )


def subscription_recover(*, tenant_id: str | None, subscription_id: uuid.UUID | str, since: datetime) -> int:
    """Requeue its FAILED and EXPIRED notifications of events since `since`; returns how many."""
    with transaction.atomic():
        subscription = _subscription(tenant_id, subscription_id)
        now = utcnow()
        return Notification.objects.filter(
            subscription=subscription,
            state__in=[Notification.State.FAILED, Notification.State.EXPIRED],
            event_created_at__gte=since,
        ).update(
            state=Notification.State.PENDING,
            step=0,
            next_attempt_at=now,
            manual=True,
            locked_until=None,
            claimed_by=None,
            updated_at=now,
        )


def notification_resend(*, tenant_id: str | None, notification_id: uuid.UUID | str) -> Notification:
    """Send one notification again now, whatever its state (its order rule still applies)."""
    with transaction.atomic():
        rows = Notification.objects.select_for_update().filter(pk=notification_id)
        rows = (
            rows.filter(subscription__tenant__isnull=True)
            if tenant_id is None
            else rows.filter(subscription__tenant_id=tenant_id)
        )
        notification = rows.first()
        if notification is None:
            raise NotFound(f"Delivery {notification_id} not found.")
        now = utcnow()
        notification.state = Notification.State.PENDING
        notification.step = 0
        notification.next_attempt_at = now
        notification.manual = True
        notification.locked_until = None
        notification.claimed_by = None  # a try still out is not recorded (notifications_record)
        notification.updated_at = now
        notification.save()
    return notification


def nats_subscription_ensure() -> Subscription | None:
    """With NATS_URL set, the operator-wide NATS subscription for every event type (created when
    missing; an operator may narrow or disable it in the admin, which is kept)."""
    if not settings.NATS_URL:
        return None
    with transaction.atomic():
        existing = Subscription.objects.filter(tenant__isnull=True, kind=Subscription.Kind.NATS).first()
        if existing is not None:
            return existing
        now = utcnow()
        return Subscription.objects.create(
            subscription_id=new_id(),
            tenant=None,
            kind=Subscription.Kind.NATS,
            name="NATS JetStream",
            subject_template=settings.NATS_SUBJECT_TEMPLATE,
            created_at=now,
            updated_at=now,
        )


# --- Retention ----------------------------------------------------------------------------

# Rows deleted per retention transaction: each holds the write lock a due timer waits for.
RETENTION_BATCH = 1000


def notifications_delete_before(
    *,
    before: datetime,
    batch_size: int = RETENTION_BATCH,
    write_guard: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> int:
    """Delete notifications in a final state (SUCCEEDED, EXPIRED) created before `before`, with
    their attempts, in batches of `batch_size` (each in its own transaction, under
    `write_guard`). An open one is kept, unless its subscription is disabled: events waiting
    that long would expire on re-enabling anyway, and a subscription left disabled must not
    collect rows for ever. Returns the count.

    Subscription by subscription, along event_notifications_sub_new; see docs/events.md."""
    deleted = 0
    final = [Notification.State.SUCCEEDED, Notification.State.EXPIRED]
    for subscription_id, enabled in list(Subscription.objects.values_list("pk", "enabled")):
        rows = Notification.objects.filter(subscription_id=subscription_id, created_at__lt=before)
        if enabled:
            rows = rows.filter(state__in=final)
        while True:
            with write_guard(), transaction.atomic():
                ids = list(rows.order_by("-created_at").values_list("pk", flat=True)[:batch_size])
                if ids:
                    Notification.objects.filter(pk__in=ids).delete()
            deleted += len(ids)
            if len(ids) < batch_size:
                break
    return deleted


# --- Fan-out: events into notifications ---------------------------------------------------


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
    the claim skips them, so their notifications wait until they are enabled again (or recovered).
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
    now = utcnow()
    rows = [
        {
            "notification_id": new_id(),
            "subscription_id": subscription.subscription_id,
            "tenant_id": event.envelope["tenantId"],
            "event_id": event.envelope["id"],
            "event_seq": event.seq,
            "aggregate_id": event.envelope["aggregateId"],
            "event_type": event.envelope["type"],
            "envelope": event.envelope,  # the same object for each subscription: dumped once
            "event_created_at": event.created_at,
            "next_attempt_at": now,
            "created_at": now,
            "updated_at": now,
        }
        for event in events
        for subscription in subscriptions
        if _matches(subscription, event)
    ]
    # No savepoint when nested (a failure rolls back the caller's whole transaction, as every
    # caller wants): a SAVEPOINT and its RELEASE are two more statements under the write lock.
    with transaction.atomic(savepoint=False):
        handed = _hand_over(rows, offer, now) if offer is not None and rows else []
        made = insert_many(Notification, rows=rows, ignore_conflicts=True)
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
    # event_notifications_open). Compared as read: the few keys below are made in the columns'
    # form, not each row read turned back into UUIDs (a burst has many open).
    waiting = set(
        sql_query(
            "SELECT {n.subscription}, {n.aggregate_id} FROM {n} WHERE {n.next_attempt_at} IS NOT NULL "
            f"AND {{n.subscription}} IN ({', '.join(['%s'] * len(enabled))}) "
            f"AND {{n.aggregate_id}} IN ({', '.join(['%s'] * len(aggregates))})",
            [*enabled, *sorted(aggregates.values())],
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


def _fan_out_subscriptions(tenant_ids: list[str]) -> list[_Target]:
    """The subscriptions of `tenant_ids` and the operator-wide ones: the ORM's
    `filter(Q(tenant_id__in=...) | Q(tenant__isnull=True))`, written once per process
    (core.db.sql_query), as the dispatcher runs it for every batch inside its write transaction."""
    keys = ", ".join(["%s"] * len(tenant_ids))
    event_types = Subscription._meta.get_field("event_types")
    return [
        _Target(db_uuid(pk), tenant_id, event_types.from_db_value(types, None, connection), db_datetime(created_at))
        for pk, tenant_id, types, created_at in sql_query(
            "SELECT {s.subscription_id}, {s.tenant}, {s.event_types}, {s.created_at} FROM {s} "
            f"WHERE {{s.tenant}} IN ({keys}) OR {{s.tenant}} IS NULL ORDER BY {{s.created_at}}, {{s.subscription_id}}",
            tenant_ids,
            s=Subscription,
        )
    ]


def _matches(subscription: _Target, event: FanoutEvent) -> bool:
    if subscription.tenant_id is not None and subscription.tenant_id != event.envelope["tenantId"]:
        return False
    if subscription.event_types and event.envelope["type"] not in subscription.event_types:
        return False
    return subscription.created_at <= event.created_at


# --- The delivery loop's claims and outcomes ----------------------------------------------


@dataclass(slots=True)
class ClaimedNotification:
    """A claimed notification as a try and its recording read it: a plain row, not a model
    instance (the delivery loop claims thousands a second during a burst, and building each
    through the ORM cost more than the database's work)."""

    pk: uuid.UUID
    subscription: Subscription  # loaded once per claim for all its notifications
    envelope: dict[str, Any]
    body: str  # event_body(envelope): made once per event, not once per subscription or try
    attempts: int
    step: int
    manual: bool
    event_created_at: datetime
    lease_until: datetime  # no other loop claims it before; a try must be over by then
    claimed_by: str = ""  # the worker session whose claim it is ("": none; NULL in the row)

    @property
    def subscription_id(self) -> uuid.UUID:
        return self.subscription.subscription_id


def notifications_claim(
    *,
    limit: int,
    now: datetime | None = None,
    in_flight: Mapping[uuid.UUID, int] | None = None,
    per_subscription: int | None = None,
    tenant_in_flight: Mapping[str, int] | None = None,
    per_tenant: int | None = None,
    claimed_by: str = "",
) -> list[ClaimedNotification]:
    """Claim due notifications of enabled subscriptions, at most `limit`, for the worker
    session `claimed_by` (whose claims the watchdog gives back should it die).

    Only the head of each (subscription, call) queue can be due: a notification with an earlier
    open one of the same call and subscription is never considered, so a later event waits
    behind an earlier one that has neither succeeded nor expired, and nothing else waits
    (docs/events.md, "Order"). With `per_subscription`, a subscription never has more than that
    many tries in flight (`in_flight` counts this loop's), so one slow receiver holds a few
    threads, never all of them; with `per_tenant`, the same for a tenant's subscriptions together
    (`tenant_in_flight`; operator-wide subscriptions count for no tenant), and the tenants take
    turns among the due (docs/events.md, "Fair shares").

    Inside a caller's transaction (the delivery loop records and claims in one) it takes no
    savepoint: a failure rolls back the caller's whole transaction, as the loop wants."""
    now = now or utcnow()
    in_flight = in_flight or {}
    tenant_in_flight = tenant_in_flight or {}
    full = [sub for sub, n in in_flight.items() if per_subscription is not None and n >= per_subscription]
    full_tenants = [t for t, n in tenant_in_flight.items() if per_tenant is not None and n >= per_tenant]
    with transaction.atomic(savepoint=False):
        # Keys first (a few candidates per place, for the per-subscription cap), whole rows only
        # for the chosen: an envelope is decoded once per try, not once per look.
        due = _due_rows(now=now, excluded=full, excluded_tenants=full_tenants, limit=limit * 4)
        if per_tenant is not None:
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
                and per_tenant is not None
                and tenant_in_flight.get(tenant, 0) + tenant_taken[tenant] >= per_tenant
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
    (delivery/senders.py, notifications_record), in one statement where the database can
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
    return sql_query(
        "SELECT n.{n.notification_id}, n.{n.subscription}, s.{s.tenant} FROM {n} n "
        "INNER JOIN {s} s ON (n.{n.subscription} = s.{s.subscription_id}) "
        "WHERE (n.{n.locked_until} IS NULL OR n.{n.locked_until} <= %s) AND n.{n.next_attempt_at} <= %s "
        "AND s.{s.enabled}" + not_excluded + " AND NOT EXISTS (SELECT 1 FROM {n} e "
        "WHERE e.{n.subscription} = n.{n.subscription} AND e.{n.aggregate_id} = n.{n.aggregate_id} "
        "AND e.{n.next_attempt_at} IS NOT NULL AND e.{n.event_seq} < n.{n.event_seq}) "
        "ORDER BY n.{n.next_attempt_at}, n.{n.event_seq} LIMIT %s" + lock,
        [now, now, *excluded, *excluded_tenants, limit],
        n=Notification,
        s=Subscription,
    )


@dataclass(frozen=True)
class SendResult:
    """What one try gave: success, or an error (with a status for an HTTP answer)."""

    succeeded: bool
    started_at: datetime
    latency_ms: int | None = None
    status_code: int | None = None
    response_snippet: str = ""
    error: str = ""
    # Seconds a 429/503 answer asked us to wait (Retry-After), if it said.
    retry_after: float | None = None
    # The receiver said it is gone for good (410): the subscription is disabled.
    gone: bool = False
    # The egress policy refused the receiver's address: as a call's EgressDenied, never tried
    # again (the next try would be refused the same way); it expires at once and its
    # subscription is disabled with the reason (docs/events.md, "Retries").
    refused: bool = False


def retry_delay(*, step: int, retry_after: float | None = None, jitter: random.Random | None = None) -> float | None:
    """Seconds until the next try after the `step`-th failure (1-based), or None when the
    schedule is used up. ±10 % jitter; a Retry-After is honoured up to twice the step."""
    schedule = settings.EVENT_DELIVERY_SCHEDULE
    if step > len(schedule):
        return None
    base = schedule[step - 1]
    if retry_after is not None and retry_after > 0:
        return min(retry_after, 2 * base)
    return base * (jitter or random).uniform(0.9, 1.1)


def notifications_record(*, results: Iterable[tuple[ClaimedNotification | Notification, SendResult]]) -> None:
    """Record the tries of claimed notifications and move each on: SUCCEEDED, FAILED with its
    next try, or EXPIRED; keep each subscription's failing streak, and disable a subscription
    that answered 410 or has failed for SUBSCRIPTION_DISABLE_AFTER.

    The successes (nearly every try) and their subscriptions' streaks are statements written
    once per process (core.db.sql_query), one per batch rather than compiled per row: the
    delivery loop records thousands of tries a second during a burst. Inside a caller's
    transaction it takes no savepoint, as notifications_claim."""
    results = list(results)
    if not results:
        return
    now = utcnow()
    expiry = timedelta(seconds=settings.EVENT_DELIVERY_EXPIRY)
    with transaction.atomic(savepoint=False):
        # A subscription deleted while its try was out took its notifications along: nothing to
        # record for those (and an attempt row pointing at them would fail the whole batch).
        # Nor for a claim the watchdog gave back meanwhile (its session was declared dead): the
        # notification is another loop's now, or due again (notifications_release_dead_claims).
        # The rows are locked on PostgreSQL (in key order, as another recorder of the same rows
        # locks them), so the watchdog cannot give a claim back between this look and the
        # writes below (notifications_release_dead_claims skips the rows locked here).
        marks = ", ".join(["%s"] * len(results))
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        holder = {
            db_uuid(pk): claimed_by or ""
            for pk, claimed_by in sql_query(
                f"SELECT {{n.notification_id}}, {{n.claimed_by}} FROM {{n}} WHERE {{n.notification_id}} IN ({marks}) "
                "ORDER BY {n.notification_id}" + lock,
                [n.pk for n, _ in results],
                n=Notification,
            )
        }
        given_back = sum(1 for n, _ in results if n.pk in holder and holder[n.pk] != (n.claimed_by or ""))
        if given_back:
            logger.warning("%d delivery tries came back after their claims were given back; not recorded", given_back)
        results = [(n, result) for n, result in results if holder.get(n.pk) == (n.claimed_by or "")]
        attempts = []
        succeeded: dict[int, list[uuid.UUID]] = {}  # by attempt count: one statement for each
        outcome_by_subscription: dict[uuid.UUID, list[SendResult]] = {}
        for notification, result in results:
            n = notification.attempts + 1
            trigger = DeliveryAttempt.Trigger.MANUAL if notification.manual else DeliveryAttempt.Trigger.SCHEDULED
            attempts.append(
                (
                    notification.pk,
                    n,
                    trigger.value,
                    result.started_at,
                    result.latency_ms,
                    result.status_code,
                    result.response_snippet[:1000],
                    result.error[:1000],
                )
            )
            if result.succeeded:
                succeeded.setdefault(n, []).append(notification.pk)
            else:
                changes: dict[str, Any] = {
                    "attempts": n,
                    "manual": False,
                    "locked_until": None,
                    "claimed_by": None,
                    "updated_at": now,
                }
                step = notification.step + 1
                delay = retry_delay(step=step, retry_after=result.retry_after)
                changes.update(step=step, last_error=result.error[:1000])
                if delay is None or result.refused or now - notification.event_created_at > expiry:
                    changes.update(state=Notification.State.EXPIRED, next_attempt_at=None)
                else:
                    changes.update(state=Notification.State.FAILED, next_attempt_at=now + timedelta(seconds=delay))
                Notification.objects.filter(pk=notification.pk).update(**changes)
            outcome_by_subscription.setdefault(notification.subscription_id, []).append(result)
        for n, keys in succeeded.items():
            sql_query(
                "UPDATE {n} SET {n.state} = %s, {n.attempts} = %s, {n.manual} = %s, {n.locked_until} = NULL, "
                "{n.claimed_by} = NULL, "
                "{n.next_attempt_at} = NULL, {n.last_error} = '', {n.updated_at} = %s, {n.delivered_at} = %s "
                f"WHERE {{n.notification_id}} IN ({', '.join(['%s'] * len(keys))})",
                [Notification.State.SUCCEEDED.value, n, False, now, now, *keys],
                n=Notification,
            )
        sql_execute_many(
            "INSERT INTO {a} ({a.notification}, {a.n}, {a.trigger}, {a.started_at}, {a.latency_ms}, "
            "{a.status_code}, {a.response_snippet}, {a.error}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING",
            attempts,
            a=DeliveryAttempt,
        )
        # In key order: two delivery loops (clusters) recording at once lock the subscriptions
        # they share in the same order, so they never deadlock on them.
        for subscription_id in sorted(outcome_by_subscription):
            _subscription_note(subscription_id, outcome_by_subscription[subscription_id], now)


def _subscription_note(subscription_id: uuid.UUID, outcomes: list[SendResult], now: datetime) -> None:
    if any(result.succeeded for result in outcomes):
        sql_query(
            "UPDATE {s} SET {s.failing_since} = NULL, {s.last_success_at} = %s WHERE {s.subscription_id} = %s",
            [now, subscription_id],
            s=Subscription,
        )
        return
    rows = Subscription.objects.filter(pk=subscription_id)
    if any(result.gone for result in outcomes):
        rows.filter(enabled=True).update(enabled=False, disabled_reason=GONE_REASON, updated_at=now)
        _log_disabled(subscription_id, GONE_REASON)
        return
    refused = next((result for result in outcomes if result.refused), None)
    if refused is not None:
        reason = f"{REFUSED_REASON}: {refused.error}"[:300]
        rows.filter(failing_since__isnull=True).update(failing_since=now)
        rows.filter(enabled=True).update(enabled=False, disabled_reason=reason, updated_at=now)
        _log_disabled(subscription_id, reason)
        return
    rows.filter(failing_since__isnull=True).update(failing_since=now)
    limit = now - timedelta(seconds=settings.SUBSCRIPTION_DISABLE_AFTER)
    reason = f"every delivery failed for {_human(settings.SUBSCRIPTION_DISABLE_AFTER)}"
    if rows.filter(enabled=True, failing_since__lte=limit).update(
        enabled=False, disabled_reason=reason, updated_at=now
    ):
        _log_disabled(subscription_id, reason)


def _log_disabled(subscription_id: uuid.UUID, reason: str) -> None:
    logger.warning("subscription disabled", extra={"subscriptionId": str(subscription_id), "reason": reason})


def _human(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} seconds"


def notifications_release(*, notifications: Sequence[ClaimedNotification | Notification]) -> None:
    """Give back claims that were not tried (the loop is stopping): due again at once. Only
    claims still held as they were made: one the watchdog gave back meanwhile may be another
    loop's now, and one finished meanwhile must not be reopened."""
    by_holder: dict[str | None, list[Any]] = {}
    for notification in notifications:
        by_holder.setdefault(notification.claimed_by or None, []).append(notification.pk)
    now = utcnow()
    for claimed_by, keys in by_holder.items():
        Notification.objects.filter(pk__in=keys, claimed_by=claimed_by, next_attempt_at__isnull=False).update(
            locked_until=None, claimed_by=None, next_attempt_at=now
        )


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
        held = (
            Notification.objects.filter(
                locked_until__gt=looked_at,
                locked_until__lte=looked_at + lease_length(),  # claimed at `looked_at` or before
                claimed_by__isnull=False,
            )
            .exclude(claimed_by__in=list(live_sessions))
            .select_for_update(skip_locked=True)  # never waits, so never deadlocks
            .order_by()
        )
        keys = list(held.values_list("pk", flat=True))
        if not keys:
            return 0
        return Notification.objects.filter(pk__in=keys).update(
            locked_until=None, claimed_by=None, next_attempt_at=due, updated_at=utcnow()
        )
