"""The engine: the long-running loops of a worker process.

Every worker process of a django-q2 cluster runs an engine (see workers/signals.py); what it
holds depends on the roles the process took (docs/architecture.md, "Every worker process
executes"):
- every engine: an execution pool that performs attempts (HTTP outside any transaction), a
  recorder that writes finished attempts and call outcomes in small batches, the backlog
  loop, which starts due calls nobody has started yet (a burst bigger than the timer's pool,
  a timer that fired late) as its pool has room, and a delivery loop to subscribers
  (docs/events.md; outside the events home it claims only while the pool is idle);
- the timer home, one per cluster: the timer loop (NearTermScheduler) that starts due calls
  the moment they are due, the watchdog (crash recovery, stuck calls) and retention, the flow
  loop, which starts the calls flow control held once their limits have room
  (docs/flow-control.md), and the schedules loop, which makes each recurring schedule's next
  call ahead (docs/schedules.md);
- the events home, one per cluster (the timer home too when the cluster has one worker
  process): the outbox dispatcher (docs/events.md).
Several engines (processes, clusters, hosts) run at once: every claim is a conditional update.
"""

from __future__ import annotations

import logging
import math
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from functools import partial
from operator import attrgetter

from django.conf import settings
from django.db import close_old_connections, connection

from core.db import ChangeWatch, urgent_writes
from core.fairness import round_robin
from core.ids import utcnow
from delivery.fanout import NotificationSink
from delivery.runner import Deliverer
from delivery.services import nats_subscription_ensure, notifications_delete_before
from execution.outcomes import ErrorKind, Outcome
from execution.services import Attempt
from orchestration.selectors import service_calls_overdue, service_calls_overdue_exist
from orchestration.services import CallKey
from outbox.dispatcher import dispatch_batch
from outbox.services import outbox_delete_published_before
from outbox.sinks import configured_sinks
from schedules.services import BATCH as SCHEDULES_BATCH
from schedules.services import schedules_materialize
from timer.scheduler import NearTermScheduler
from timer.selectors import DueTimer
from workers import recovery
from workers.flow import FlowLoop
from workers.keeper import SessionKeeper
from workers.pipeline import record, run_attempt, start_and_claim, start_and_claim_overdue
from workers.services import RunRecorder, runs_delete_older_than
from workers.shares import FairShares

logger = logging.getLogger("serviceagent.engine")

tenant_of = attrgetter("tenant_id")

# The GIL switch interval in the engine's process (see Engine.start).
SWITCH_INTERVAL_SECONDS = 0.001
# How long the recorder waits for more outcomes before writing a batch, and the most it
# writes in one transaction (each holds the write lock the timer and the dispatcher wait for).
RECORD_GATHER_SECONDS = 0.01
RECORD_BATCH = 100
# Due calls started (and their attempts claimed) per transaction, at most; never more than
# the execution pool has free threads for, so a claimed attempt leaves at once (an attempt
# claimed but queued would be Interrupted, not resent, if the process died).
START_CHUNK = 100
# The backlog loop: a call due this long ago that nobody has started is anybody's; it looks
# that often (a read), and sooner when an attempt of this process finishes.
BACKLOG_GRACE_SECONDS = 0.02
BACKLOG_POLL_SECONDS = 0.02
# ... and claims once this many of its pool's threads are free (or all of a smaller pool), so a
# burst is started in chunks, not one write transaction per finished attempt; but with a thread
# free it never waits longer than this (a pool kept nearly full by slow calls).
BACKLOG_MIN_CLAIM = 16
BACKLOG_MAX_WAIT_SECONDS = 0.2
# With nothing overdue and nothing committed since, its looks are skipped; one reads at least
# this often, as calls also fall due by the clock alone.
BACKLOG_QUIET_RECHECK_SECONDS = 0.1
# A due call whose start failed in the backlog is left aside this long (logged), not retried in
# a tight loop; the others go on.
SET_ASIDE_SECONDS = 60.0


class Reservation:
    """Free threads of the pool taken for one claim (Engine.reserve), and how many of them each
    tenant was given so far (Engine.take_slot)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.tenants: Counter[str] = Counter()

    def __bool__(self) -> bool:
        return self.size > 0


# How often the schedules loop looks for schedules whose call made ahead came due, and how
# long a schedule whose round failed is left aside.
SCHEDULES_INTERVAL_SECONDS = 1.0
SCHEDULE_SET_ASIDE_SECONDS = 60.0
# How long a stopping delivery loop waits for its tries out to come back (Engine.stop's drain
# bound covers it).
DELIVERY_STOP_SECONDS = 5.0
# Outbox events claimed per dispatch transaction, at most (OUTBOX_BATCH_SIZE may be smaller):
# a due timer waits for the transaction in progress, so none may be long.
DISPATCH_CHUNK = 100
# With nothing to publish and nothing committed since, the dispatcher's looks are skipped; one
# reads at least this often (a publication that failed is tried again by the clock).
DISPATCH_QUIET_RECHECK_SECONDS = 0.5


class WriteGate:
    """One write transaction at a time among the engine's threads, the timer's first.

    SQLite has one write lock per database, and a connection that finds it taken sleeps in
    SQLite's busy handler (1, 2, 5, 10 ... 100 ms steps) while others take it in turn: the
    timer loop's start of a due call could wait hundreds of milliseconds behind the
    recorder and the dispatcher of its own process. Waiting here instead wakes a thread the
    moment the lock is free, and an urgent (timer) waiter goes before the others, then an
    early one (the outbox dispatcher: every delivery waits for its fan-out) at every other
    slot while others wait, then the rest in arrival order. On PostgreSQL it only orders this
    process's writers, which costs next to nothing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._urgent = 0
        self._early = 0
        # The others go in arrival order, so the recorder and the delivery loop take turns.
        self._next_ticket = 0
        self._serving = 0
        self._waiting = 0
        # Whether the last slot went to an early waiter: while others wait, an early waiter
        # gets every other slot at most (a dispatcher with a long backlog never shuts out the
        # recorder and the starts of its process).
        self._last_early = False

    @contextmanager
    def slot(self, *, urgent: bool = False, early: bool = False) -> Iterator[None]:
        with self._cond:
            if urgent:
                self._urgent += 1
                try:
                    while self._busy:
                        self._cond.wait()
                finally:
                    self._urgent -= 1
            elif early:
                self._early += 1
                try:
                    while self._busy or self._urgent or (self._last_early and self._waiting):
                        self._cond.wait()
                finally:
                    self._early -= 1
            else:
                ticket = self._next_ticket
                self._next_ticket += 1
                self._waiting += 1
                try:
                    while (
                        self._busy or self._urgent or (self._early and not self._last_early) or ticket != self._serving
                    ):
                        self._cond.wait()
                finally:
                    self._waiting -= 1
                self._serving += 1
            self._busy = True
            self._last_early = early
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    @contextmanager
    def urgent(self) -> Iterator[None]:
        # First in this process, and (on SQLite) before the other processes' writers.
        with self.slot(urgent=True), urgent_writes():
            yield

    def early(self) -> AbstractContextManager[None]:
        return self.slot(early=True)


class Engine:
    def __init__(
        self,
        keeper: SessionKeeper,
        *,
        timer: bool = True,
        events: bool = True,
        take_role: Callable[[str], bool] | None = None,
        single_worker: bool = True,
    ) -> None:
        self.keeper = keeper
        # Takes a role's lock if it is free (workers/signals.py); None: the roles are fixed.
        self.take_role = take_role
        self.single_worker = single_worker
        # The roles this process took (workers/signals.py): one timer home and one events home
        # per cluster; every engine executes attempts.
        self.hosts_timer = timer
        self.hosts_events = events
        self.concurrency = settings.EXECUTION_CONCURRENCY
        # Set when the pool has room for a claim again, or the timer left due calls.
        self._room = threading.Event()
        self._min_claim = min(BACKLOG_MIN_CLAIM, self.concurrency)
        # Due calls whose start failed in the backlog loop, until when they are left aside.
        self._set_aside: dict = {}
        self.stop_event = threading.Event()
        # When a stopping engine stops waiting for its threads (Engine.stop).
        self._stop_deadline = math.inf
        self.recorder = RunRecorder(session_id=keeper.session_id)
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="attempt")
        self.results: queue.Queue[tuple[Attempt, Outcome]] = queue.Queue()
        self.in_flight = 0
        self._in_flight_lock = threading.Lock()
        # The pool's threads shared among tenants (docs/flow-control.md, "Fair shares").
        self.shares = FairShares(size=self.concurrency, per_tenant=settings.EXECUTION_PER_TENANT)
        self.threads: list[threading.Thread] = []
        self.gate = WriteGate()
        self.scheduler = NearTermScheduler(
            self.on_due,
            poll_interval=settings.TIMER_POLL_INTERVAL_MS / 1000,
            horizon=settings.TIMER_HORIZON_MS / 1000,
            batch_size=settings.TIMER_BATCH_SIZE,
            # Reached marks in batches: one write transaction per firing would hold the SQLite
            # write lock that the next due timers' start is waiting for.
            mark_interval=0.1,
            on_run=self._record_run,
            write_guard=self.gate.urgent,
        )
        self.flow = FlowLoop(self._start_held, on_run=self._record_run)
        # The delivery loop's (_delivery_loop), to which the dispatcher of this process hands the
        # heads its fan-out makes (_dispatch_loop); a new one whenever that loop starts again.
        self.deliverer = self._new_deliverer()

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def session_id(self) -> str:
        return self.keeper.session_id

    def start(self) -> None:
        # Every SQLite call releases the GIL; getting it back behind a busy thread takes up to
        # the switch interval (5 ms by default), so a transaction of a few dozen statements
        # could hold the write lock for 100 ms while its thread queues for the GIL.
        sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
        self._run_loops(
            [
                ("recorder", self._recorder_loop),
                ("backlog", self._backlog_loop),
                ("delivery", self._delivery_loop),
                ("watchdog", self._watchdog_loop),
            ]
        )
        if self.hosts_timer:
            self._run_loops(self._timer_loops())
        if self.hosts_events:
            self._run_loops(self._events_loops())
        logger.info(
            "engine started",
            extra={"workerSession": self.session_id, "timer": self.hosts_timer, "events": self.hosts_events},
        )

    def _timer_loops(self) -> list:
        return [("timer", self._timer_loop), ("flow", self._flow_loop), ("schedules", self._schedules_loop)]

    def _events_loops(self) -> list:
        return [("dispatch", self._dispatch_loop)]

    def _run_loops(self, loops: list) -> None:
        for name, target in loops:
            thread = threading.Thread(target=self._guarded(name, target), name=f"engine-{name}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def _take_vacant_roles(self) -> None:
        """A role whose holder died while no worker was being spawned to take it (django-q2
        spawns a replacement before the worker it replaces is gone, so the replacement found
        the lock still held) is taken by the next engine that finds its lock free. The events
        role goes to a worker other than the timer home while there are several."""
        if self.take_role is None or self.stop_event.is_set():
            return
        if not self.hosts_timer and self.take_role("engine"):
            logger.warning("this worker took the vacant timer role", extra={"workerSession": self.session_id})
            self.hosts_timer = True
            self._run_loops(self._timer_loops())
        if not self.hosts_events and (not self.hosts_timer or self.single_worker) and self.take_role("events"):
            logger.warning("this worker took the vacant events role", extra={"workerSession": self.session_id})
            self.hosts_events = True
            self._run_loops(self._events_loops())

    def stop(self, *, drain_seconds: float = 10.0) -> None:
        """Stop taking work, let in-flight attempts finish (bounded), record, close the session."""
        if self.stop_event.is_set():
            return
        deadline = self._stop_deadline = time.monotonic() + drain_seconds
        self.stop_event.set()
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for thread in self.threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        try:
            self._flush_results()
            self.recorder.session_id = self.session_id
            self.recorder.flush(force=True)
            # Attempts still in flight stay Sending; the next watchdog interrupts them.
        except Exception:
            logger.exception("engine shutdown bookkeeping failed")
        finally:
            connection.close()
        logger.info("engine stopped", extra={"workerSession": self.session_id})

    def _guarded(self, name: str, target):
        def run() -> None:
            while not self.stop_event.is_set():
                try:
                    target()
                except Exception:
                    logger.exception("engine loop %s crashed; restarting it in 1s", name)
                    close_old_connections()
                    self.stop_event.wait(1.0)
            connection.close()

        return run

    def _record_run(self, loop: str, *, started: float, items: int, error: BaseException | None = None) -> None:
        self.recorder.record(loop, started=started, items=items, error=error)

    # -- timer -> start -> execute ------------------------------------------------------------
    def _timer_loop(self) -> None:
        self.scheduler.run(self.stop_event)

    def on_due(self, timers: list[DueTimer]) -> None:
        """DueTimeReached for a batch: start the calls and hand their attempts to the pool.

        In chunks: the first requests go out while later calls are still being started, and
        the recorder and the dispatcher get the write lock between chunks. No more than the
        pool has room for: the rest stays Scheduled and due, and the backlog loops of every
        engine start it as their pools have room.
        """
        pending = round_robin([CallKey(t.tenant_id, t.service_call_id) for t in timers], key=tenant_of)
        while pending:
            with self.reserve(min(START_CHUNK, len(pending))) as room:
                if not room:
                    self._room.set()  # this process's backlog loop takes over when room frees
                    return
                chunk, pending = self._admitted(pending, room)
                if chunk:
                    with self.gate.urgent():
                        attempts = start_and_claim(chunk, worker_id=self.session_id)
                    self.execute(attempts, room=room)

    def _admitted(self, keys: Sequence[CallKey], room: Reservation) -> tuple[list[CallKey], list[CallKey]]:
        """Of `keys`, those whose tenants get a thread of `room` (in their order), and those left
        once it is full. A call whose tenant has used its share stays Scheduled and due: the
        backlog loops start it once its tenant has room again."""
        chunk = []
        for n, key in enumerate(keys):
            if len(chunk) == room.size:
                return chunk, list(keys[n:])
            if self.take_slot(room, key.tenant_id):
                chunk.append(key)
        return chunk, []

    def take_slot(self, room: Reservation, tenant_id: str) -> bool:
        """One thread of `room` for a call of `tenant_id`, if its fair share allows it now."""
        with self._in_flight_lock:
            unassigned = room.size - room.tenants.total()
            # Free for the shares: the threads nobody holds or reserved, and this room's own.
            free = self.concurrency - self.in_flight + unassigned
            if unassigned <= 0 or not self.shares.room_for(tenant_id, free):
                return False
            room.tenants[tenant_id] += 1
            self.shares.take(tenant_id)
            return True

    def _full_tenants(self) -> list[str]:
        """The tenants that may take no free thread of this pool now (docs/flow-control.md)."""
        with self._in_flight_lock:
            return self.shares.full(self.concurrency - self.in_flight)

    def room(self) -> int:
        """Attempts the pool can start at once."""
        with self._in_flight_lock:
            return self.concurrency - self.in_flight

    @contextmanager
    def reserve(self, wanted: int, *, at_least: int = 1) -> Iterator[Reservation]:
        """Up to `wanted` of the pool's free threads, taken before a claim (so two claimers of
        this process never count the same free threads) and given back if the claim made fewer
        attempts; none when fewer than `at_least` are free."""
        with self._in_flight_lock:
            free = self.concurrency - self.in_flight
            size = min(wanted, free) if free >= at_least else 0
            self.in_flight += size
        room = Reservation(size)
        try:
            yield room
        finally:
            if room.size:
                with self._in_flight_lock:
                    self.in_flight -= room.size
                    for tenant_id, count in (+room.tenants).items():  # admitted, never started
                        self.shares.give_back(tenant_id, count)

    def _backlog_loop(self) -> None:
        """Start the due calls nobody has started, as this process's pool has room: a burst
        larger than one pool is shared by every worker process of every cluster.

        It claims once BACKLOG_MIN_CLAIM threads are free, so a burst is started in chunks; but
        never waits longer than BACKLOG_MAX_WAIT_SECONDS with a thread free, so a pool that slow
        calls keep nearly full (or a small one) still starts the backlog. A start that fails sets
        its calls aside for a while, one by one, so one bad row never stops the others."""
        last_claim = time.monotonic()
        # Calls fall due by the clock too: a skipped look (core.db.ChangeWatch) is made up soon.
        watch = ChangeWatch(recheck=BACKLOG_QUIET_RECHECK_SECONDS)
        while not self.stop_event.is_set():
            now = time.monotonic()
            for pk, until in list(self._set_aside.items()):
                if until <= now:
                    del self._set_aside[pk]
            due_before = utcnow() - timedelta(seconds=BACKLOG_GRACE_SECONDS)
            free = self.room()
            full = self._full_tenants() if free else []
            if free and watch.read(
                partial(
                    service_calls_overdue_exist,
                    due_before=due_before,
                    exclude=list(self._set_aside),
                    exclude_tenants=full,
                ),
                empty=False,
            ):
                at_least = self._min_claim if now - last_claim < BACKLOG_MAX_WAIT_SECONDS else 1
                with self.reserve(START_CHUNK, at_least=at_least) as room:
                    if room:
                        last_claim = now
                        started = self._start_overdue(due_before, room, full)
                        if started:
                            self._record_run("backlog", started=now, items=started)
                            continue
            elif free:
                last_claim = now  # nothing waits: the wait for a full chunk starts afresh
            self._room.wait(BACKLOG_POLL_SECONDS)
            if self._room.is_set():  # room freed, or the timer left due calls to the backlog
                self._room.clear()  # (a wake that comes after this stays set for the next wait)
                watch.forget()

    def _start_overdue(self, due_before, room: Reservation, full: list[str]) -> int:
        exclude = list(self._set_aside)
        try:
            with self.gate.slot():
                attempts = start_and_claim_overdue(
                    due_before=due_before,
                    limit=room.size,
                    exclude=exclude,
                    exclude_tenants=full,
                    take_slot=partial(self.take_slot, room),
                    worker_id=self.session_id,
                )
        except Exception as exc:
            logger.exception("starting the due backlog failed; trying its calls one by one")
            self._record_run("backlog", started=time.monotonic(), items=0, error=exc)
            close_old_connections()
            attempts = []
            for tenant_id, pk in service_calls_overdue(
                due_before=due_before, limit=room.size, exclude=exclude, exclude_tenants=full
            ):
                key = CallKey(tenant_id, pk)
                if not self.take_slot(room, tenant_id):
                    continue
                try:
                    with self.gate.slot():
                        attempts += start_and_claim([key], worker_id=self.session_id)
                except Exception:
                    logger.exception(
                        "starting a due call failed; set aside for %ss",
                        SET_ASIDE_SECONDS,
                        extra={"tenantId": key.tenant_id, "serviceCallId": str(key.service_call_id)},
                    )
                    close_old_connections()
                    self._set_aside[key.service_call_id] = time.monotonic() + SET_ASIDE_SECONDS
        self.execute(attempts, room=room)
        return len(attempts)

    def _flow_loop(self) -> None:
        self.flow.run(self.stop_event)

    def _start_held(self, keys: list[CallKey]) -> int:
        """Start held calls (the flow loop): after the timer's starts, never before them, and
        within their tenant's fair share of the pool (the others stay held for the next look)."""
        with self.reserve(len(keys)) as room:
            chunk, _ = self._admitted(keys, room)
            if not chunk:
                return 0
            with self.gate.slot():
                attempts = start_and_claim(chunk, worker_id=self.session_id)
            self.execute(attempts, room=room)
        return len(attempts)

    def execute(self, attempts: list[Attempt], *, room: Reservation | None = None) -> None:
        """Hand attempts to the pool; with `room`, they take the threads reserved for them."""
        for attempt in attempts:
            tenant_id = attempt.order.tenant_id
            with self._in_flight_lock:
                if room is not None and room.size:
                    room.size -= 1  # already counted in flight by the reservation
                else:
                    self.in_flight += 1
                if room is not None and room.tenants[tenant_id] > 0:
                    room.tenants[tenant_id] -= 1  # already held by its tenant (take_slot)
                else:  # the watchdog's resumed attempts
                    self.shares.take(tenant_id)
            try:
                self.pool.submit(self._perform, attempt)
            except RuntimeError:  # pool shut down: the watchdog of the next session resolves it
                with self._in_flight_lock:
                    self.in_flight -= 1
                    self.shares.give_back(tenant_id)

    def _perform(self, attempt: Attempt) -> None:
        try:
            outcome = run_attempt(attempt)
        except Exception as exc:  # perform() never raises; this is a last line
            outcome = Outcome.failure(ErrorKind.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            with self._in_flight_lock:
                self.in_flight -= 1
                room = self.concurrency - self.in_flight
                was_full = self.shares.give_back(attempt.order.tenant_id)
            # Just enough room for the backlog loop to claim, or a tenant that used its share
            # has room again for its waiting calls.
            if room == self._min_claim or was_full:
                self._room.set()
        self.results.put((attempt, outcome))

    # -- recording outcomes in batches --------------------------------------------------------
    def _recorder_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                first = self.results.get(timeout=0.1)
            except queue.Empty:
                continue
            batch = [first]
            # Group commit: what finishes within a few milliseconds goes in the same
            # transaction (one write lock for many outcomes instead of one each).
            gather_until = time.monotonic() + RECORD_GATHER_SECONDS
            while len(batch) < RECORD_BATCH:
                try:
                    batch.append(self.results.get(timeout=max(0.0, gather_until - time.monotonic())))
                except queue.Empty:
                    break
            self._record_batch(batch)

    def _record_batch(self, batch: list[tuple[Attempt, Outcome]]) -> None:
        started = time.monotonic()
        for attempt_number in range(5):
            try:
                with self.gate.slot():
                    record(batch)
                self._record_run("execution", started=started, items=len(batch))
                if self.hosts_timer:  # the flow loop runs there
                    self.flow.finished(attempt.order.tenant_id for attempt, _ in batch)
                return
            except Exception as exc:
                logger.exception("recording %d outcomes failed (try %d)", len(batch), attempt_number + 1)
                self._record_run("execution", started=started, items=0, error=exc)
                close_old_connections()
                if len(batch) > 1:
                    # One bad outcome must not sink the others (other tenants' among them):
                    # record each in a transaction of its own.
                    for one in batch:
                        self._record_batch([one])
                    return
                time.sleep(0.2 * (attempt_number + 1))
        # Left Sending: the watchdog turns it Interrupted rather than lose it silently.
        logger.error("gave up recording %d outcomes", len(batch))

    def _flush_results(self) -> None:
        batch = []
        while True:
            try:
                batch.append(self.results.get_nowait())
            except queue.Empty:
                break
        if batch:
            self._record_batch(batch)

    # -- outbox -------------------------------------------------------------------------------
    def _dispatch_loop(self) -> None:
        idle = settings.OUTBOX_POLL_INTERVAL_MS / 1000
        limit = min(settings.OUTBOX_BATCH_SIZE, DISPATCH_CHUNK)
        with self.gate.slot():
            nats_subscription_ensure()
        published = 0
        # Events are made by commits, but a failed publication, or a dead dispatcher's lease,
        # falls due by the clock: a skipped look (core.db.ChangeWatch) is made up within
        # DISPATCH_QUIET_RECHECK_SECONDS.
        watch = ChangeWatch(recheck=DISPATCH_QUIET_RECHECK_SECONDS)
        while not self.stop_event.is_set():
            started = time.monotonic()
            # Behind (its last batch was full): ahead of the other writers but the timer, as
            # every delivery waits for its fan-out; caught up, in turn with them.
            guard = self.gate.early if published >= limit else self.gate.slot
            # The fan-out makes the heads it can claimed for this process's delivery loop, which
            # takes them as the batch commits: an event's first tries start with its fan-out,
            # not at the loop's next poll and write.
            deliverer = self.deliverer
            try:
                sinks = tuple(
                    NotificationSink(offer=deliverer.offer) if isinstance(sink, NotificationSink) else sink
                    for sink in configured_sinks()
                )
                try:
                    published = dispatch_batch(limit=limit, write_guard=guard, sinks=sinks, watch=watch)
                finally:
                    deliverer.offers_done()  # the room not taken given back at once, the taken tried
            except Exception as exc:
                logger.exception("outbox dispatch failed")
                self._record_run("dispatch", started=started, items=0, error=exc)
                close_old_connections()
                self.stop_event.wait(1.0)
                continue
            self._record_run("dispatch", started=started, items=published)
            if published < limit:
                # Caught up: let events gather for one poll interval rather than take the
                # write lock twice for every few events (lag stays within that interval).
                self.stop_event.wait(idle)

    # -- delivery to subscribers ----------------------------------------------------------------
    def _delivery_loop(self) -> None:
        """Notifications to subscribers (docs/events.md): claimed, tried on the deliverer's own
        threads, recorded as they come back."""
        idle = settings.DELIVERY_POLL_INTERVAL_MS / 1000
        if self.deliverer.stopping:  # this loop ran before and stopped on an error: a fresh one
            self.deliverer = self._new_deliverer()
        deliverer = self.deliverer
        try:
            while not self.stop_event.is_set():
                started = time.monotonic()
                try:
                    moved = deliverer.step()
                except Exception as exc:
                    logger.exception("event delivery failed")
                    self._record_run("delivery", started=started, items=0, error=exc)
                    close_old_connections()
                    self.stop_event.wait(1.0)
                    continue
                if moved:
                    self._record_run("delivery", started=started, items=moved)
                    deliverer.gather(RECORD_GATHER_SECONDS)
                else:
                    deliverer.wait(idle)
        finally:
            # The tries out come back and are recorded, within a bound and within the engine's
            # (Engine.stop waits that long for this thread); one still out then is sent again
            # after its lease.
            left = self._stop_deadline - time.monotonic()
            deliverer.stop(timeout=max(0.0, min(DELIVERY_STOP_SECONDS, left)))

    def _new_deliverer(self) -> Deliverer:
        """Notifications to subscribers (docs/events.md): claimed (or handed over by the fan-out),
        tried on the deliverer's own threads, recorded as they come back."""
        return Deliverer(
            concurrency=settings.DELIVERY_CONCURRENCY,
            batch_size=settings.DELIVERY_BATCH_SIZE,
            per_subscription=settings.DELIVERY_PER_SUBSCRIPTION,
            per_tenant=settings.DELIVERY_PER_TENANT,
            write_guard=self.gate.slot,
            may_claim=self._may_deliver,
            session=self.keeper.surely_alive,
        )

    def _may_deliver(self) -> bool:
        """The events home delivers whenever notifications are due; every other engine only
        while its pool has no attempt in flight, so that during a burst its core goes to the
        calls (and the timer home's to the precise starts), and after it to the deliveries."""
        return self.hosts_events or self.in_flight == 0

    # -- recurring schedules ------------------------------------------------------------------
    def _schedules_loop(self) -> None:
        """Each schedule's next call, made as the one made ahead comes due, and its missed
        occurrences settled when the workers come back (docs/schedules.md). A schedule whose
        round fails is logged and left aside for a minute, never retried in a tight loop."""
        set_aside: dict = {}
        while not self.stop_event.is_set():
            started = time.monotonic()
            for schedule_id, until in list(set_aside.items()):
                if until <= started:
                    del set_aside[schedule_id]
            try:
                done = schedules_materialize(write_guard=self.gate.slot, set_aside=set_aside)
            except Exception as exc:
                logger.exception("schedules pass failed")
                self._record_run("schedules", started=started, items=0, error=exc)
                close_old_connections()
                self.stop_event.wait(SCHEDULES_INTERVAL_SECONDS)
                continue
            for schedule_id in done.failed:
                set_aside[schedule_id] = started + SCHEDULE_SET_ASIDE_SECONDS
            error = RuntimeError(f"{len(done.failed)} schedule round(s) failed") if done.failed else None
            self._record_run("schedules", started=started, items=done.advanced, error=error)
            if done.handled < SCHEDULES_BATCH:  # a full batch: more are due, go on at once
                self.stop_event.wait(SCHEDULES_INTERVAL_SECONDS)

    # -- watchdog, retention, heartbeat -------------------------------------------------------
    def _watchdog_loop(self) -> None:
        next_retention = 0.0
        while not self.stop_event.wait(2.0):
            try:
                self._take_vacant_roles()
            except Exception:
                logger.exception("taking a vacant role failed")
            if self.hosts_timer:
                self._sweep()
            if self.hosts_timer and time.monotonic() >= next_retention:
                next_retention = time.monotonic() + 3600
                self._retention()
            self.recorder.session_id = self.session_id
            with self.gate.slot():
                self.recorder.flush()

    def _sweep(self) -> None:
        started = time.monotonic()
        try:
            with self.gate.slot():
                moved = recovery.sweep(worker_id=self.session_id, execute=self.execute)
            self._record_run("watchdog", started=started, items=moved)
        except Exception as exc:
            logger.exception("watchdog sweep failed")
            self._record_run("watchdog", started=started, items=0, error=exc)
            close_old_connections()

    def _retention(self) -> None:
        started = time.monotonic()
        try:
            with self.gate.slot():
                deleted = runs_delete_older_than(before=utcnow() - timedelta(days=settings.RETENTION_DAYS))
            if settings.OUTBOX_RETENTION_DAYS:  # 0 keeps every event
                before = utcnow() - timedelta(days=settings.OUTBOX_RETENTION_DAYS)
                deleted += outbox_delete_published_before(before=before, write_guard=self.gate.slot)
                # Delivered and expired notifications, as old (their attempts go with them).
                deleted += notifications_delete_before(before=before, write_guard=self.gate.slot)
            self._record_run("retention", started=started, items=deleted)
        except Exception as exc:
            logger.exception("retention failed")
            self._record_run("retention", started=started, items=0, error=exc)
