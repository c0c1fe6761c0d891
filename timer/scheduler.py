"""The near-term scheduler: a heap of timers due soon, fed from the durable table.

The table stays the truth. The heap only holds timers due within the horizon, so the loop can
sleep until the next one is due and fire it within milliseconds, instead of waiting for a
poll. Two feeds keep the heap current:
- every `poll_interval`, timers registered since the last seen id (cheap: a range on the id);
- every `full_refresh`, all timers due within the horizon (catches anything the incremental
  feed could miss, e.g. ids committed out of order on PostgreSQL, or a failed fire).
Firing is at least once: a timer leaves the table's Scheduled state only after `on_due`
returned, and the receiver of DueTimeReached is idempotent.

With a `lead`, timers are fired ahead of their due time, in batches: when the next one is `lead`
away, every timer due within twice that is fired, and `on_due` starts their calls, whose
requests wait for their due time in their threads (docs/architecture.md, "Started ahead, sent
on time"). `on_due` hands back the timers it would not start ahead; they are fired again when
they are due. With `mark_interval`, fired
timers are marked Reached in batches (at most that often, at a moment when no timer is about
to fall due) instead of one transaction per firing: on SQLite each write transaction takes
the one write lock, which the next due timers' start then waits for. A timer fired but not
yet marked stays known here, so it is not fired again; after a crash it is fired again,
harmlessly.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime, timedelta

from core.db import ChangeWatch
from core.db.wakeups import Channel, wakeups
from timer.selectors import DueTimer, timers_due_before, timers_outlook
from timer.services import timers_mark_reached

logger = logging.getLogger(__name__)

# Given the timers to fire (some perhaps not due yet, with a lead), it returns those of them it
# did not take because they are not due yet: fired again, each at its due time.
OnDue = Callable[[list[DueTimer]], "list[DueTimer] | None"]

# Fired timers not yet marked Reached are marked at once past this many, even while more
# timers are due (memory stays bounded during a long burst).
MARK_BACKLOG = 20_000

# While the agent is idle and the wake-ups listen, the full refresh runs this seldom, or just in
# time for the next timer beyond the horizon (docs/architecture.md, "Wake, don't poll").
IDLE_FULL_REFRESH = 10.0

# A feed (a read of the table) or a marking (a write) waits while a timer falls due within this
# many seconds, so that it does not make that timer late; a feed never longer than one poll
# interval.
CLEARANCE = 0.005


class NearTermScheduler:
    def __init__(
        self,
        on_due: OnDue,
        *,
        poll_interval: float = 0.02,
        horizon: float = 5.0,
        full_refresh: float = 1.0,
        batch_size: int = 500,
        mark_interval: float = 0.0,
        lead: float = 0.0,
        on_run: Callable[..., None] | None = None,
        write_guard: Callable[[], AbstractContextManager] = nullcontext,
    ) -> None:
        self.on_due = on_due
        self.poll_interval = poll_interval
        self.horizon = horizon
        self.full_refresh = min(full_refresh, horizon / 2)
        self.batch_size = batch_size
        self.on_run = on_run
        self._heap: list[tuple[float, int, DueTimer]] = []
        # Fired ahead and handed back by on_due: fired again at their due time, not before.
        self._exact: list[tuple[float, int, DueTimer]] = []
        self.lead = lead
        self._known: set[int] = set()
        # Timers whose on_due failed go back on the heap at a later time (never a tight loop).
        self._failures: dict[int, int] = {}
        self._last_id = 0
        self._next_full = 0.0
        self._next_poll = 0.0
        self.mark_interval = mark_interval
        self.write_guard = write_guard
        # Fired (on_due returned) but not yet marked Reached in the table.
        self._fired: list[int] = []
        self._next_mark = 0.0
        # The incremental feed reads new rows only, which only a commit makes (and wakes the
        # timer channel for); the full refresh reads on its own clock.
        self._feed_watch = ChangeWatch(
            recheck=self.full_refresh, channel=Channel.TIMER, listening_recheck=IDLE_FULL_REFRESH
        )

    # -- feeding ------------------------------------------------------------------------------
    def _push(self, timers: list[DueTimer]) -> None:
        for timer in timers:
            if timer.id in self._known:
                continue
            self._known.add(timer.id)
            heapq.heappush(self._heap, (timer.due_at.timestamp(), timer.id, timer))
            self._last_id = max(self._last_id, timer.id)

    def refresh(self, *, full: bool) -> None:
        until = datetime.now(UTC) + timedelta(seconds=self.horizon)
        if full:
            # Remember the high-water mark first, so nothing registered meanwhile is skipped.
            high, next_due = timers_outlook(after=until)
            self._push(timers_due_before(until=until, limit=50_000, known=self._known))
            self._last_id = max(self._last_id, high)
            self._next_full = time.monotonic() + self._full_refresh_after(next_due)
            return
        mark = self._feed_watch.mark()
        if mark is None:  # nothing committed since (core.db.ChangeWatch)
            return
        found = timers_due_before(until=until, after_id=self._last_id, limit=50_000)
        self._feed_watch.done(mark, found=bool(found))
        self._push(found)
        # Ids are taken before their transactions commit, not always in commit order: a timer
        # committed after a later id was read is found by a full refresh, soon after any news.
        self._next_full = min(self._next_full, time.monotonic() + self.full_refresh)

    def _full_refresh_after(self, next_due: datetime | None) -> float:
        """How long until the next full refresh: `full_refresh` while timers are near or the
        wake-ups are not listening; idle, IDLE_FULL_REFRESH or until the next timer beyond the
        horizon comes into it."""
        if self._heap or self._exact or self._fired or not wakeups.listening:
            return self.full_refresh
        wait = IDLE_FULL_REFRESH
        if next_due is not None:
            wait = min(wait, (next_due - datetime.now(UTC)).total_seconds() - self.horizon)
        return max(self.full_refresh, wait)

    # -- firing -------------------------------------------------------------------------------
    def _next_fire(self) -> float:
        """When the next timer is to be fired (seconds since the epoch; inf when none is near):
        `lead` before it is due, or when it is due for one handed back."""
        ahead = self._heap[0][0] - self.lead if self._heap else math.inf
        return min(ahead, self._exact[0][0]) if self._exact else ahead

    def _pop_due(self, now: float) -> list[DueTimer]:
        due = []
        while self._exact and self._exact[0][0] <= now and len(due) < self.batch_size:
            due.append(heapq.heappop(self._exact)[2])
        if self._heap and self._heap[0][0] - self.lead <= now:
            # The next timer is `lead` away: every one due within twice that goes with it.
            until = now + 2 * self.lead
            while self._heap and self._heap[0][0] <= until and len(due) < self.batch_size:
                due.append(heapq.heappop(self._heap)[2])
        return due

    def fire(self, due: list[DueTimer]) -> None:
        try:
            later = self.on_due(due) or []
            done = due
        except Exception:
            logger.exception("firing a batch of %d timers failed; retrying one by one", len(due))
            done, later = [], []
            for timer in due:
                try:
                    later += self.on_due([timer]) or []
                    done.append(timer)
                except Exception:
                    self._set_aside(timer)
        # Handed back (never one due when on_due looked): fired at its due time, or at once if
        # that came while on_due ran.
        if later:
            handed_back = {timer.id for timer in later}
            done = [timer for timer in done if timer.id not in handed_back]
            for timer in later:
                heapq.heappush(self._exact, (timer.due_at.timestamp(), timer.id, timer))
        if done:
            if not self._fired:
                self._next_mark = time.monotonic() + self.mark_interval
            self._fired.extend(timer.id for timer in done)
            for timer in done:
                self._failures.pop(timer.id, None)

    def mark_reached(self) -> int:
        """Mark the fired timers Reached in one transaction; returns how many were pending."""
        ids, self._fired = self._fired, []
        if not ids:
            return 0
        try:
            with self.write_guard():
                timers_mark_reached(ids=ids)
        finally:
            # Marked, or the marking failed and the table still says Scheduled: either way
            # the next full refresh sees the truth (fired again at worst, which is harmless).
            for timer_id in ids:
                self._known.discard(timer_id)
        return len(ids)

    def _set_aside(self, timer: DueTimer) -> None:
        failures = self._failures.get(timer.id, 0) + 1
        self._failures[timer.id] = failures
        delay = min(60.0, 0.5 * 2**failures)
        heapq.heappush(self._heap, (time.time() + delay, timer.id, timer))
        logger.error(
            "timer %s set aside for %.1fs after %d failures",
            timer.id,
            delay,
            failures,
            extra={"tenantId": timer.tenant_id, "serviceCallId": str(timer.service_call_id)},
        )

    # -- the loop -----------------------------------------------------------------------------
    def step(self) -> float:
        """Do what is due now; return how long the loop may sleep."""
        now_mono = time.monotonic()
        if now_mono >= self._next_poll and self._clear_to_feed(now_mono):
            started = time.monotonic()
            full = now_mono >= self._next_full
            before = len(self._known)
            try:
                self.refresh(full=full)
                self._report(started, len(self._known) - before)
            except Exception as exc:
                logger.exception("timer refresh failed")
                self._report(started, 0, exc)
                if full:
                    self._next_full = now_mono + self.full_refresh
            self._next_poll = now_mono + self.poll_interval
        while True:
            due = self._pop_due(time.time())
            if not due:
                break
            started = time.monotonic()
            try:
                self.fire(due)
                self._report(started, len(due))
            except Exception as exc:
                logger.exception("firing timers failed")
                self._report(started, 0, exc)
                for timer in due:
                    self._known.discard(timer.id)
        next_due = self._next_fire() - time.time() if self._heap or self._exact else self.poll_interval
        if self._fired and (
            self.mark_interval <= 0
            or len(self._fired) >= MARK_BACKLOG
            or (time.monotonic() >= self._next_mark and next_due > CLEARANCE)
        ):
            try:
                self.mark_reached()
            except Exception as exc:
                logger.exception("marking timers reached failed")
                self._report(time.monotonic(), 0, exc)
            # With no timer near, the feed's own clock (or a commit's wake) ends the sleep.
        next_due = self._next_fire() - time.time()
        wake = self._next_poll - time.monotonic()
        if self._feed_watch.waits_for_wake():  # a commit wakes the loop; else the next full refresh
            wake = max(wake, self._next_full - time.monotonic())
        if wake <= 0 and 0 < next_due <= CLEARANCE:  # the feed waits for that timer (_clear_to_feed)
            wake = min(next_due, wake + self.poll_interval)
        if self._fired and next_due > CLEARANCE:  # a timer about to fall due wakes the loop anyway
            wake = min(wake, self._next_mark - time.monotonic())
        return max(0.0, min(next_due, wake))

    def _clear_to_feed(self, now_mono: float) -> bool:
        """Whether a feed may read the table now: not while a timer falls due within
        CLEARANCE, unless the feed has already waited a poll interval."""
        if not (self._heap or self._exact) or now_mono >= self._next_poll + self.poll_interval:
            return True
        return self._next_fire() - time.time() > CLEARANCE

    def _report(self, started: float, items: int, error: BaseException | None = None) -> None:
        if self.on_run is not None and (items or error):
            self.on_run("timer", started=started, items=items, error=error)

    def run(self, stop: threading.Event) -> None:
        self._last_id = 0
        try:
            while not stop.is_set():
                seen = wakeups.seen_now(Channel.TIMER)
                pause = self.step()
                if pause > 0:  # a commit that registers a timer ends it (core/db/wakeups.py)
                    wakeups.wait(Channel.TIMER, seen=seen, timeout=pause)
        finally:
            try:
                self.mark_reached()
            except Exception:  # left Scheduled: fired again by the next engine, harmlessly
                logger.exception("marking timers reached at shutdown failed")
