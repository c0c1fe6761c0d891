"""The results of tries, recorded: each notification moved on (SUCCEEDED, FAILED with its next
try, EXPIRED), its attempt kept, its subscription's failing streak noted (docs/events.md,
"Retries")."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from core.db import db_uuid, sql_execute_many, sql_query
from core.db.wakeups import Channel, notify
from core.ids import utcnow
from delivery.models import DeliveryAttempt, Notification, Subscription
from delivery.services.subscriptions import notifications_park
from delivery.tries import ClaimedNotification, SendResult

logger = logging.getLogger("serviceagent.delivery")

# A subscription disabled by the receiver itself.
GONE_REASON = "the endpoint answered 410 Gone"
# A subscription whose URL the egress policy refused is disabled with this reason and the
# refusal's own message (which names the class of the address, never the address).
REFUSED_REASON = "its URL is refused by the egress policy"


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
        if succeeded or attempts:  # the next event of each queue is due now
            notify(Channel.DELIVERY)


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
        if rows.filter(enabled=True).update(enabled=False, disabled_reason=GONE_REASON, updated_at=now):
            notifications_park(subscription_id)
        _log_disabled(subscription_id, GONE_REASON)
        return
    refused = next((result for result in outcomes if result.refused), None)
    if refused is not None:
        reason = f"{REFUSED_REASON}: {refused.error}"[:300]
        rows.filter(failing_since__isnull=True).update(failing_since=now)
        if rows.filter(enabled=True).update(enabled=False, disabled_reason=reason, updated_at=now):
            notifications_park(subscription_id)
        _log_disabled(subscription_id, reason)
        return
    rows.filter(failing_since__isnull=True).update(failing_since=now)
    limit = now - timedelta(seconds=settings.SUBSCRIPTION_DISABLE_AFTER)
    reason = f"every delivery failed for {_human(settings.SUBSCRIPTION_DISABLE_AFTER)}"
    if rows.filter(enabled=True, failing_since__lte=limit).update(
        enabled=False, disabled_reason=reason, updated_at=now
    ):
        notifications_park(subscription_id)
        _log_disabled(subscription_id, reason)


def _log_disabled(subscription_id: uuid.UUID, reason: str) -> None:
    logger.warning("subscription disabled", extra={"subscriptionId": str(subscription_id), "reason": reason})


def _human(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} seconds"
