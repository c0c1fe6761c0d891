"""ChangeWatch: a loop's idle poll skipped while nothing has been committed, and its sleep until
something is (docs/architecture.md, "Wake, don't poll").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections

from core.db.wakeups import Channel, wakeups

T = TypeVar("T")


class ChangeWatch:
    """Whether a loop's poll may skip its read: nothing was committed for it since its last read,
    which found nothing.

    The engine's loops look for work and, while the agent is idle, find none. With `channel`,
    while this process's wake-ups listen (core/db/wakeups.py), `sleep` waits for the channel's
    wake: an idle loop neither reads nor ticks. On SQLite, listening or polling, a read is
    skipped while `PRAGMA data_version` of the loop's own connection stands still since a read
    that found nothing (it moves whenever another connection commits: the same read would find
    nothing again); on PostgreSQL, while the channel has not woken since. Elsewhere (a database
    in memory, PostgreSQL without a listener) every poll reads.

    Either way, what falls due by the clock alone (a retry, a lease) is no commit: a read is never
    skipped more than `recheck` seconds after the last one, or past the moment the read said
    the next work falls due (`due_in`).

    A loop whose own writes can make work for its own read must not skip across them: it reports
    such a read as having found something, or calls `forget`. One watch per loop, used from that
    loop's thread.

        rows = watch.read(lambda: poll_query(), empty=[])  # what it returns, if true, is found
        ...
        watch.sleep(0.05)  # found nothing: until the channel wakes or a read falls due
    """

    def __init__(
        self, *, recheck: float, channel: Channel | None = None, listening_recheck: float | None = None
    ) -> None:
        # Polling, a read is made at least every `recheck`; while the wake-ups listen, at least
        # every `listening_recheck`: a wake says that a commit was made.
        self.recheck = recheck
        self.listening_recheck = recheck if listening_recheck is None else listening_recheck
        self.channel = channel
        # The source (wake-ups, or the SQLite connection), its version and the time of the last
        # read, if it found nothing; and until when (time.monotonic) the next read may wait.
        self._quiet: tuple[Any, int, float] | None = None
        self._quiet_until = 0.0
        # When the last read was made (time.monotonic): `sleep` keeps reads `poll` apart.
        self._last_read = 0.0
        self._woken_at_mark = 0
        # Whether `mark` ran since the last `sleep`, and the channel's wakes when that sleep
        # ended: a wake ends one sleep, not every later one of a loop that did not look meanwhile.
        self._marked = False
        self._slept_to = 0

    def mark(self) -> tuple[Any, int, float] | None:
        """Before the read: None if it may be skipped, else what to pass to `done`. Taken before
        the read, so that a commit made while the read runs is seen by the next mark."""
        now = time.monotonic()
        if self.channel is not None:
            # The wakes seen before this look: a sleep after it ends at the next one.
            self._woken_at_mark = wakeups.seen_now(self.channel)
            self._marked = True
        conn = connections[DEFAULT_DB_ALIAS]
        generation = wakeups.generation(self.channel) if self.channel is not None else None
        if conn.vendor == "sqlite" and not conn.is_in_memory_db():
            # On SQLite whether anything was committed is the connection's own data_version,
            # which, unlike a wake, leaves out this loop's own commits.
            conn.ensure_connection()
            source = conn.connection
            version = source.execute("PRAGMA data_version").fetchone()[0]
        elif generation is not None:
            source, version = _WAKEUPS, generation
        else:
            return _EVERY_READ
        quiet = self._quiet
        if quiet is not None and quiet[0] is source and quiet[1] == version and now < self._quiet_until:
            return None
        self._last_read = now
        return (source, version, now)

    def done(self, mark: tuple[Any, int, float], *, found: bool) -> None:
        """After the read: whether it found anything."""
        self._quiet = None if found or mark is _EVERY_READ else mark
        if self._quiet is not None:
            listening = self.channel is not None and wakeups.listening
            self._quiet_until = mark[2] + (self.listening_recheck if listening else self.recheck)

    def due_in(self, seconds: float) -> None:
        """The read that found nothing also found that work falls due in `seconds`: the next read
        waits no longer than that."""
        if self._quiet is not None:
            self._quiet_until = min(self._quiet_until, time.monotonic() + max(0.0, seconds))

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

    def waits_for_wake(self) -> bool:
        """Whether the next read waits for the channel's wake (or the clock), the wake-ups
        listening: a loop may sleep until then."""
        return self._quiet is not None and self.channel is not None and wakeups.listening

    def seconds_quiet(self, poll: float) -> float:
        """How long a loop whose look found nothing may sleep: until the next read falls due
        when it waits for a wake, else `poll`."""
        if self.waits_for_wake():
            return max(0.0, self._quiet_until - time.monotonic())
        return poll

    def sleep(self, poll: float, *, longest: float = float("inf")) -> None:
        """After a look that found nothing: wait until the channel wakes or the next read falls
        due (listening), else `poll` seconds (the channel's wakes still end it early); never
        longer than `longest` (a caller that must see its own stop signal)."""
        if self.channel is None:
            time.sleep(poll)
            return
        if not self._marked:
            # No look since its last sleep (a loop that may not read now, its pool full, say): it
            # polls, ended early by a wake after that sleep, never spinning on an older one.
            self._slept_to = wakeups.wait(self.channel, seen=self._slept_to, timeout=min(longest, poll))
        elif self.waits_for_wake():
            timeout = min(longest, self.seconds_quiet(poll))
            self._slept_to = wakeups.wait(self.channel, seen=self._woken_at_mark, timeout=timeout)
        else:
            self._slept_to = wakeups.wait(self.channel, seen=wakeups.seen_now(self.channel), timeout=poll)
        self._marked = False
        # Woken: no sooner than `poll` after the last read. During a burst commits wake the loops
        # every few milliseconds; each looks no more often than it polled before the wake-ups.
        rest = min(longest, poll) - (time.monotonic() - self._last_read)
        if rest > 0:
            time.sleep(rest)


_EVERY_READ: tuple[Any, int, float] = (None, -1, 0.0)
_WAKEUPS = object()
