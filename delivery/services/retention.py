"""Notifications' retention: what is final and old is deleted in batches (docs/events.md)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime

from django.db import transaction

from delivery.models import Notification, Subscription

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
