"""Worker sessions (heartbeats) and loop-run records: the workers module's own tables."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from core.ids import new_id, utcnow
from core.partitions import DailyPartitions, drop, drop_detached, make_ahead, partitions
from workers.models import LoopRun, WorkerSession

# Loop runs partitioned by day of their start on PostgreSQL (docs/schema.md, "History
# partitioned by day"): each day's go whole at retention.
RUN_DAYS = DailyPartitions(LoopRun._meta.db_table, LoopRun._meta.get_field("started_at").column, uuid7=False)


def session_start() -> WorkerSession:
    now = utcnow()
    return WorkerSession.objects.create(
        id=str(new_id()),
        hostname=socket.gethostname(),
        pid=os.getpid(),
        started_at=now,
        last_heartbeat_at=now,
        status=WorkerSession.Status.RUNNING,
    )


def session_beat(*, session_id: str) -> bool:
    """Returns False if the session was declared dead meanwhile (it must stop working).

    In a transaction of its own: on SQLite that takes the write lock the way the engine's
    writers do (eventservice/sqlite polls for it), rather than in SQLite's own busy handler,
    whose growing sleeps let a busy engine starve the heartbeat until the session looks dead.
    """
    with transaction.atomic():
        return bool(
            WorkerSession.objects.filter(id=session_id, status=WorkerSession.Status.RUNNING).update(
                last_heartbeat_at=utcnow()
            )
        )


def session_stop(*, session_id: str, error: BaseException | None = None) -> None:
    fields = {"stopped_at": utcnow(), "status": WorkerSession.Status.SUCCESS}
    if error is not None:
        fields.update(
            status=WorkerSession.Status.ERROR, error_type=type(error).__name__, error_message=str(error)[:2000]
        )
    WorkerSession.objects.filter(id=session_id, status=WorkerSession.Status.RUNNING).update(**fields)


def sessions_mark_stale(*, now: datetime | None = None) -> list[str]:
    """Sessions that stopped beating become `unknown`, stopped at their last heartbeat."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=settings.WORKER_STALE_SECONDS)
    stale = list(
        WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING, last_heartbeat_at__lt=cutoff).values_list(
            "id", "last_heartbeat_at"
        )
    )
    marked = []
    with transaction.atomic():
        for session_id, last in stale:
            # Still silent: a heartbeat written since the look keeps the session alive.
            if WorkerSession.objects.filter(
                id=session_id, status=WorkerSession.Status.RUNNING, last_heartbeat_at__lt=cutoff
            ).update(status=WorkerSession.Status.UNKNOWN, stopped_at=last):
                marked.append(session_id)
    return marked


def live_session_ids() -> set[str]:
    return set(WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING).values_list("id", flat=True))


def runs_delete_older_than(
    *, before: datetime, write_guard: Callable[[], AbstractContextManager[None]] = nullcontext
) -> int:
    """Delete the loop runs started before `before` (under `write_guard`); returns the count.
    Where the table is partitioned by day (PostgreSQL), the days wholly before it go with their
    partitions (counted by PostgreSQL's estimate of their rows; their files freed afterwards,
    outside the guard: core.partitions.drop_detached), and only the rest of the last day row by
    row (its started_at is the partition key, so the DELETE reads only that day's partition)."""
    drop_detached(RUN_DAYS)  # a crashed run's
    deleted = 0
    for day in partitions(RUN_DAYS):
        if day.default or day.upper is None or day.upper > before:
            continue
        with write_guard():
            if drop(RUN_DAYS, day):
                deleted += day.rows
    drop_detached(RUN_DAYS)
    with write_guard():
        count, _ = LoopRun.objects.filter(started_at__lt=before).delete()
    return deleted + count


def runs_partitions_make(*, now: datetime) -> list[str]:
    """Where the table is partitioned, today's partition of the loop runs and the next days',
    where missing (core.partitions.make_ahead); the names made."""
    return make_ahead(RUN_DAYS, now=now)


@dataclass
class _Window:
    started_at: datetime
    runs: int = 0
    items: int = 0
    errors: int = 0
    busy_ms: float = 0.0
    last_error: str = ""


@dataclass
class RunRecorder:
    """Counts a loop's runs in memory and writes one record per loop per window.

    A timer loop wakes many times a second; a row per wake-up would cost more than the work.
    """

    session_id: str
    window_seconds: float = 10.0
    _windows: dict[str, _Window] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, loop: str, *, started: float, items: int, error: BaseException | None = None) -> None:
        # The registry's loops are the names a run may have (worker_loop_runs holds no list of
        # them: adding a loop needs no migration). Imported here: the loops use this module.
        from workers.loops import loop_names

        if loop not in loop_names():
            raise ValueError(f"no loop named {loop!r} is registered (workers/loops/__init__.py)")
        duration_ms = (time.monotonic() - started) * 1000
        with self._lock:
            window = self._windows.setdefault(loop, _Window(started_at=utcnow()))
            window.runs += 1
            window.items += items
            window.busy_ms += duration_ms
            if error is not None:
                window.errors += 1
                window.last_error = f"{type(error).__name__}: {error}"[:2000]

    def flush(self, *, force: bool = False) -> None:
        now = utcnow()
        with self._lock:
            due = {
                loop: w
                for loop, w in self._windows.items()
                if force or (now - w.started_at).total_seconds() >= self.window_seconds
            }
            for loop in due:
                del self._windows[loop]
        rows = [
            LoopRun(
                session_id=self.session_id,
                loop=loop,
                started_at=w.started_at,
                duration_ms=round(w.busy_ms, 3),
                runs=w.runs,
                items=w.items,
                errors=w.errors,
                error_message=w.last_error,
            )
            for loop, w in due.items()
            if w.items or w.errors
        ]
        if rows:
            LoopRun.objects.bulk_create(rows)
