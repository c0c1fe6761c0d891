"""Retention: loop runs older than RETENTION_DAYS, and published outbox events with delivered
and expired notifications older than OUTBOX_RETENTION_DAYS, deleted (docs/architecture.md,
"What the workers record"). Where these tables are partitioned by day (PostgreSQL), it first
makes the partitions of today and the next days, and the days past retention go whole
(docs/schema.md, "History partitioned by day").

The timer home runs it (one per cluster): soon after it starts, then hourly.
"""

from __future__ import annotations

import time
from datetime import timedelta

from django.conf import settings

from core.ids import utcnow
from delivery.services import notifications_delete_before, notifications_partitions_make
from outbox.services import outbox_delete_published_before, outbox_feed_floors_set, outbox_partitions_make
from workers.loops.base import Loop, Where
from workers.services import runs_delete_older_than, runs_partitions_make

RETENTION_FIRST_SECONDS = 2.0
RETENTION_INTERVAL_SECONDS = 3600.0


class RetentionLoop(Loop):
    name = "retention"
    where = Where.TIMER_HOME
    first_wait_seconds = RETENTION_FIRST_SECONDS
    idle_seconds = RETENTION_INTERVAL_SECONDS
    failure = "retention failed"
    error_pause_seconds = RETENTION_INTERVAL_SECONDS

    def step(self) -> bool:
        started = time.monotonic()
        gate = self.engine.gate
        now = utcnow()
        with gate.slot():
            runs_partitions_make(now=now)
            outbox_partitions_make(now=now)
            notifications_partitions_make(now=now)
        deleted = runs_delete_older_than(before=now - timedelta(days=settings.RETENTION_DAYS), write_guard=gate.slot)
        if settings.OUTBOX_RETENTION_DAYS:  # 0 keeps every event
            before = now - timedelta(days=settings.OUTBOX_RETENTION_DAYS)
            deleted += outbox_delete_published_before(before=before, write_guard=gate.slot)
            # Delivered and expired notifications, as old (their attempts go with them).
            deleted += notifications_delete_before(before=before, write_guard=gate.slot)
        with gate.slot():
            # The events feed's floors, up to the oldest event still unpublished now.
            outbox_feed_floors_set(now=now)
        self.record(started=started, items=deleted)
        return False
