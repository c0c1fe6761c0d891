"""The watchdog: every 2 s, crash recovery and stuck calls (workers/recovery.py): sessions that
stopped beating, their attempts judged, calls stuck between two steps moved on
(docs/architecture.md, "Never lose, never send twice").

The timer home runs it (one per cluster).
"""

from __future__ import annotations

import time

from core.db import one_transaction
from workers import recovery
from workers.loops.base import Loop, Where

WATCHDOG_INTERVAL_SECONDS = 2.0


class WatchdogLoop(Loop):
    name = "watchdog"
    where = Where.TIMER_HOME
    first_wait_seconds = WATCHDOG_INTERVAL_SECONDS
    idle_seconds = WATCHDOG_INTERVAL_SECONDS
    failure = "watchdog sweep failed"
    error_pause_seconds = WATCHDOG_INTERVAL_SECONDS

    def step(self) -> bool:
        started = time.monotonic()
        engine = self.engine
        resumed = []
        # One transaction on PostgreSQL: an idle pass is one, not one per read.
        with engine.gate.slot(), one_transaction():
            moved = recovery.sweep(worker_id=engine.session_id, execute=resumed.extend)
        engine.execute(resumed)  # once their claim committed
        self.record(started=started, items=moved)
        return False
