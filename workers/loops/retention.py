"""Retention: loop runs older than RETENTION_DAYS, and published outbox events with delivered
and expired notifications older than OUTBOX_RETENTION_DAYS, deleted (docs/architecture.md,
"What the workers record").

The timer home runs it (one per cluster): soon after it starts, then hourly.
"""

from __future__ import annotations

import time
from datetime import timedelta

from django.conf import settings

from core.ids import utcnow
from delivery.services import notifications_delete_before
from outbox.services import outbox_delete_published_before
from workers.loops.base import Loop, Where
from workers.services import runs_delete_older_than

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
        with gate.slot():
            deleted = runs_delete_older_than(before=utcnow() - timedelta(days=settings.RETENTION_DAYS))
        if settings.OUTBOX_RETENTION_DAYS:  # 0 keeps every event
            before = utcnow() - timedelta(days=settings.OUTBOX_RETENTION_DAYS)
            deleted += outbox_delete_published_before(before=before, write_guard=gate.slot)
            # Delivered and expired notifications, as old (their attempts go with them).
            deleted += notifications_delete_before(before=before, write_guard=gate.slot)
        self.record(started=started, items=deleted)
        return False
