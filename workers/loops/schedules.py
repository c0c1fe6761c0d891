"""The schedules loop: each recurring schedule's next call, made as the one made ahead comes
due, and its missed occurrences settled when the workers come back (docs/schedules.md).

The timer home runs it (one per cluster). It sleeps until the next schedule's call made ahead
comes due, or a schedule is made or changed (the schedules channel, core/db/wakeups.py). A
schedule whose round fails is logged and left aside for a minute, never retried in a tight loop.
"""

from __future__ import annotations

import time
from datetime import datetime

from core.db import ChangeWatch
from core.db.wakeups import Channel
from core.ids import utcnow
from schedules.materialize import BATCH as SCHEDULES_BATCH
from schedules.materialize import schedules_materialize
from schedules.selectors import schedules_next_advance
from workers.loops.base import Loop, Where

# How often the loop looks for schedules whose call made ahead came due while the wake-ups do
# not listen, and how long a schedule whose round failed is left aside.
SCHEDULES_INTERVAL_SECONDS = 1.0
SCHEDULE_SET_ASIDE_SECONDS = 60.0
# Listening, it looks at least this often (each look says when the next advance falls due).
SCHEDULES_RECHECK_SECONDS = 60.0


class SchedulesLoop(Loop):
    name = "schedules"
    where = Where.TIMER_HOME
    failure = "schedules pass failed"
    error_pause_seconds = SCHEDULES_INTERVAL_SECONDS

    def run(self) -> None:
        self.set_aside: dict = {}
        self.watch = ChangeWatch(
            recheck=SCHEDULES_INTERVAL_SECONDS, channel=Channel.SCHEDULES, listening_recheck=SCHEDULES_RECHECK_SECONDS
        )
        super().run()

    def step(self) -> bool:
        started = time.monotonic()
        for schedule_id, until in list(self.set_aside.items()):
            if until <= started:
                del self.set_aside[schedule_id]
        mark = self.watch.mark()
        if mark is None:  # no schedule changed and none came due since the last look
            return False
        # One read while none is due (on SQLite every commit wakes the loop).
        next_at = schedules_next_advance(exclude=self.set_aside)
        if next_at is None or next_at > utcnow():
            self._quiet(mark, next_at)
            return False
        done = schedules_materialize(write_guard=self.engine.gate.slot, set_aside=self.set_aside)
        for schedule_id in done.failed:
            self.set_aside[schedule_id] = started + SCHEDULE_SET_ASIDE_SECONDS
        error = RuntimeError(f"{len(done.failed)} schedule round(s) failed") if done.failed else None
        self.record(started=started, items=done.advanced, error=error)
        more = done.handled >= SCHEDULES_BATCH  # a full batch: more are due, go on at once
        if not more:
            self._quiet(mark, schedules_next_advance(exclude=self.set_aside))
        return more

    def _quiet(self, mark: tuple, next_at: datetime | None) -> None:
        """Nothing more is due: the next look when the next advance falls due, a schedule set
        aside comes back, or the channel wakes."""
        self.watch.done(mark, found=False)
        if next_at is not None:
            self.watch.due_in((next_at - utcnow()).total_seconds())
        if self.set_aside:
            self.watch.due_in(min(self.set_aside.values()) - time.monotonic())

    def idle(self) -> None:
        self.watch.sleep(SCHEDULES_INTERVAL_SECONDS)
