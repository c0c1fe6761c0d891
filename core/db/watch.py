"""ChangeWatch: a loop's idle poll skipped while nothing has been committed (docs/architecture.md,
"Where the loops run: inside django-q2").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections

T = TypeVar("T")


class ChangeWatch:
    """Whether a loop's poll may skip its read: nothing was committed since its last read, which
    found nothing.

    The engine's loops look for work ten to fifty times a second and, while the agent is idle,
    find none. On SQLite, `PRAGMA data_version` of the loop's own connection moves whenever
    another connection commits (another process's, or another thread's of this process; never
    this connection's own): while it stands still since a read that found nothing, the same read
    would find nothing again, but for what falls due by the clock alone (a retry, a lease), which
    `recheck` bounds: a read is never skipped more than `recheck` seconds after the last one. The
    pragma reads one word of the WAL index, where each poll's read planned and ran a statement
    (docs/architecture.md, "Where the loops run: inside django-q2"). Elsewhere (PostgreSQL, a
    database in memory) every poll reads.

    A loop whose own writes can make work for its own read must not skip across them: it reports
    such a read as having found something, or calls `forget`. One watch per loop, used from that
    loop's thread.

        rows = watch.read(lambda: poll_query(), empty=[])  # what it returns, if true, is found
    """

    def __init__(self, *, recheck: float) -> None:
        self.recheck = recheck
        # The connection, its data_version and the time of the last read, if it found nothing.
        self._quiet: tuple[Any, int, float] | None = None

    def mark(self) -> tuple[Any, int, float] | None:
        """Before the read: None if it may be skipped, else what to pass to `done`. Taken before
        the read, so that a commit made while the read runs is seen by the next mark."""
        conn = connections[DEFAULT_DB_ALIAS]
        if conn.vendor != "sqlite" or conn.is_in_memory_db():
            return _EVERY_READ
        conn.ensure_connection()
        raw = conn.connection
        version = raw.execute("PRAGMA data_version").fetchone()[0]
        now = time.monotonic()
        quiet = self._quiet
        if quiet is not None and quiet[0] is raw and quiet[1] == version and now - quiet[2] < self.recheck:
            return None
        return (raw, version, now)

    def done(self, mark: tuple[Any, int, float], *, found: bool) -> None:
        """After the read: whether it found anything."""
        self._quiet = None if found or mark is _EVERY_READ else mark

    def read(self, read: Callable[[], T], *, empty: T) -> T:
        """What `read()` returns (found: if true), or `empty` when the read may be skipped."""
        mark = self.mark()
        if mark is None:
            return empty
        result = read()
        self.done(mark, found=bool(result))
        return result

    def forget(self) -> None:
        """The next read is not skipped (the loop was told that there may be work)."""
        self._quiet = None


_EVERY_READ: tuple[Any, int, float] = (None, -1, 0.0)
