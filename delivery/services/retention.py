"""Notifications' retention: what is final and old is deleted in batches, or, where the table is
partitioned by day (PostgreSQL), dropped a whole day at a time (docs/events.md)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime

from django.db import transaction

from core.partition_queries import key_range
from core.partitions import Partition, drop, drop_detached, drop_past_days, make_ahead, partition_of
from delivery.models import Notification, Subscription
from delivery.partitions import ATTEMPT_DAYS, NOTIFICATION_DAYS, OPEN_SQL

# Rows deleted per retention transaction: each holds the write lock a due timer waits for.
RETENTION_BATCH = 1000

# What keeps a day's partition: an open notification of an enabled subscription (a disabled
# one's would expire on re-enabling, and goes with the rest, as below).
_STILL_OPEN = (
    f"p.{OPEN_SQL} AND EXISTS (SELECT 1 FROM {Subscription._meta.db_table} s "
    f"WHERE s.{Subscription._meta.pk.column} = p.{Notification._meta.get_field('subscription').column} AND s.enabled)"
)


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

    Where the table is partitioned (PostgreSQL), a day whose notifications are all of events
    older than `before` and none is open goes whole: its partition is dropped with its tries'
    (counted by PostgreSQL's estimate of its rows). A day with an open one keeps its partition
    and loses the rest row by row, as does what no day's partition holds (a converted table's
    past, the DEFAULT partition's strays); a day not yet wholly past `before` waits for the next
    run. Subscription by subscription, along event_notifications_sub_new; see docs/events.md."""

    def drop_day(day: Partition) -> bool:
        tries = partition_of(day, ATTEMPT_DAYS)
        return drop(NOTIFICATION_DAYS, day, unless=_STILL_OPEN, with_=[(ATTEMPT_DAYS, tries)] if tries else [])

    drop_detached(ATTEMPT_DAYS)  # a crashed run's
    deleted, left = drop_past_days(NOTIFICATION_DAYS, before=before, drop_day=drop_day, write_guard=write_guard)
    drop_detached(ATTEMPT_DAYS)  # the tries' days detached now, outside the write guard
    for lower, upper in left:
        rows = Notification.objects.filter(key_range("notification_id", lower, upper))
        deleted += _delete_final(rows, before, batch_size, write_guard)
    return deleted


def _delete_final(
    notifications: object,
    before: datetime,
    batch_size: int,
    write_guard: Callable[[], AbstractContextManager[None]],
) -> int:
    deleted = 0
    if not notifications.filter(created_at__lt=before).exists():
        # Nothing old in this range (what no day's partition holds is mostly nothing): one probe,
        # not three statements for each subscription.
        return 0
    final = [Notification.State.SUCCEEDED, Notification.State.EXPIRED]
    for subscription_id, enabled in list(Subscription.objects.values_list("pk", "enabled")):
        rows = notifications.filter(subscription_id=subscription_id, created_at__lt=before)
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


def notifications_partitions_make(*, now: datetime) -> list[str]:
    """Where the tables are partitioned, today's partition of the notifications and of their
    tries and the next days', where missing (core.partitions.make_ahead); the names made."""
    return make_ahead(NOTIFICATION_DAYS, now=now) + make_ahead(ATTEMPT_DAYS, now=now)
