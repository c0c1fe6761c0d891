"""What every loop of an engine is: a name, where it runs, and one step (docs/architecture.md,
"Adding a loop")."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from django.db import close_old_connections

if TYPE_CHECKING:
    from workers.engine import Engine


class Where(enum.Enum):
    """The worker processes that run a loop (docs/architecture.md, "Where the loops run: inside
    django-q2"); workers/signals.py gives each process its roles."""

    EVERY_WORKER = "every worker process"
    # One per cluster: the worker holding the cluster's `engine` lock.
    TIMER_HOME = "the timer home"
    # One per cluster: the worker holding the cluster's `events` lock.
    EVENTS_HOME = "the events home"


class Loop:
    """One long-running loop: the engine builds one per process (`Loop(engine)`) and runs `run` on
    a thread `engine-<name>` in the processes that hold its role, until the engine stops.

    The engine is what the loops share: its execution pool and fair shares (`reserve`,
    `take_slot`, `execute`), its write gate (`gate`), its run recorder (`record_run`), its stop
    event and its deliverer.
    """

    # The loop's name (at most 16 characters): its thread's, and its runs' in worker_loop_runs.
    name: ClassVar[str]
    where: ClassVar[Where]
    # When its runs are recorded under another name than its own.
    recorded_as: ClassVar[str] = ""
    # How long the loop sleeps after a step that found nothing to do (see `idle`).
    idle_seconds: ClassVar[float] = 1.0
    # Logged when a step raises: the error is recorded as a run of the loop, which pauses for
    # error_pause_seconds (never a tight loop of failures). None: the step's error ends `run`,
    # and the engine starts the loop again a second later.
    failure: ClassVar[str | None] = "loop step failed"
    error_pause_seconds: ClassVar[float] = 1.0
    # How long the loop waits before its first step.
    first_wait_seconds: ClassVar[float] = 0.0
    logger: ClassVar[logging.Logger] = logging.getLogger("serviceagent.engine")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def run_name(cls) -> str:
        """The name its runs are recorded under."""
        return cls.recorded_as or cls.name

    def run(self) -> None:
        """Step until the engine stops, sleeping only after a step that found nothing to do."""
        stop = self.engine.stop_event
        if self.first_wait_seconds and stop.wait(self.first_wait_seconds):
            return
        while not stop.is_set():
            started = time.monotonic()
            try:
                busy = self.step()
            except Exception as exc:
                if self.failure is None:
                    raise
                self.logger.exception(self.failure)
                self.record(started=started, items=0, error=exc)
                close_old_connections()
                stop.wait(self.error_pause_seconds)
                continue
            if not busy:
                self.idle()

    def step(self) -> bool:
        """One unit of work; whether there is more to do at once (False: the loop sleeps)."""
        raise NotImplementedError

    def idle(self) -> None:
        """Sleep after a step that found nothing to do; a stopping engine wakes it."""
        self.engine.stop_event.wait(self.idle_seconds)

    def record(self, *, started: float, items: int, error: BaseException | None = None) -> None:
        """Count one run (started at `started`, by time.monotonic) in the engine's run records."""
        self.engine.record_run(self.run_name(), started=started, items=items, error=error)

    def calls_finished(self, tenant_ids: Sequence[str]) -> None:
        """Calls of these tenants finished in this process (room may have freed for theirs)."""

    def finish(self) -> None:
        """The engine stopped and joined its threads (whether this loop ran or not): the last
        bookkeeping."""
