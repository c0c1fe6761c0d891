"""The schedules loop: each recurring schedule's next call, made as the one made ahead comes
due, and its missed occurrences settled when the workers come back (docs/schedules.md).

The timer home runs it (one per cluster). A schedule whose round fails is logged and left aside
for a minute, never retried in a tight loop.
"""

from __future__ import annotations

import time

from schedules.services import BATCH as SCHEDULES_BATCH
from schedules.services import schedules_materialize
from workers.loops.base import Loop, Where

# How often the loop looks for schedules whose call made ahead came due, and how long a
# schedule whose round failed is left aside.
SCHEDULES_INTERVAL_SECONDS = 1.0
SCHEDULE_SET_ASIDE_SECONDS = 60.0


class SchedulesLoop(Loop):
    name = "schedules"
    where = Where.TIMER_HOME
    idle_seconds = SCHEDULES_INTERVAL_SECONDS
    failure = "schedules pass failed"
    error_pause_seconds = SCHEDULES_INTERVAL_SECONDS

    def run(self) -> None:
        self.set_aside: dict = {}
        super().run()

    def step(self) -> bool:
        started = time.monotonic()
        for schedule_id, until in list(self.set_aside.items()):
            if until <= started:
                del self.set_aside[schedule_id]
        done = schedules_materialize(write_guard=self.engine.gate.slot, set_aside=self.set_aside)
        for schedule_id in done.failed:
            self.set_aside[schedule_id] = started + SCHEDULE_SET_ASIDE_SECONDS
        error = RuntimeError(f"{len(done.failed)} schedule round(s) failed") if done.failed else None
        self.record(started=started, items=done.advanced, error=error)
        return done.handled >= SCHEDULES_BATCH  # a full batch: more are due, go on at once
