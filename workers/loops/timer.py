"""The timer loop: starts due calls a moment before they are due, their requests leaving when
they are due (timer/scheduler.py, NearTermScheduler), through Engine.on_due, never more than the
pool has free threads for (docs/architecture.md, "Timer precision with a durable table").

The timer home runs it (one per cluster).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings

from timer.scheduler import NearTermScheduler
from workers.loops.base import Loop, Where

if TYPE_CHECKING:
    from workers.engine import Engine

# Reached marks are written in batches at most this often: one write transaction per firing
# would hold the SQLite write lock that the next due timers' start is waiting for.
MARK_INTERVAL_SECONDS = 0.1


class TimerLoop(Loop):
    name = "timer"
    where = Where.TIMER_HOME

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.scheduler = NearTermScheduler(
            engine.on_due,
            poll_interval=settings.TIMER_POLL_INTERVAL_MS / 1000,
            horizon=settings.TIMER_HORIZON_MS / 1000,
            batch_size=settings.TIMER_BATCH_SIZE,
            mark_interval=MARK_INTERVAL_SECONDS,
            lead=settings.TIMER_LEAD_MS / 1000,
            on_run=engine.record_run,
            write_guard=engine.gate.urgent,
        )

    def run(self) -> None:
        # The scheduler has its steps of its own (a heap of near-term timers, fed by polls).
        self.scheduler.run(self.engine.stop_event)
