"""The engine: the long-running loops of a worker process, and what they share.

Every worker process of a django-q2 cluster runs an engine (see workers/signals.py); which of the
loops it runs depends on the roles the process took (docs/architecture.md, "Where the loops run:
inside django-q2"). Each loop is a module of workers/loops/, listed in its registry
(workers/loops/__init__.py), which says where it runs:
- every worker process: the recorder (recorder.py), which writes finished attempts and call
  outcomes in small batches; the backlog loop (backlog.py), which starts due calls nobody has
  started yet as its pool has room; the delivery loop to subscribers (delivery.py;
  docs/events.md);
- the timer home, one per cluster: the timer loop (timer.py), the flow loop (flow.py;
  docs/flow-control.md), the schedules loop (schedules.py; docs/schedules.md), the watchdog
  (watchdog.py) and retention (retention.py);
- the events home, one per cluster (the timer home too when the cluster has one worker
  process): the outbox dispatcher (dispatch.py; docs/events.md).
The engine holds what they share: an execution pool that performs attempts (HTTP outside any
transaction) within each tenant's fair share (workers/shares.py), the write gate
(workers/gate.py), the run recorder, the stop event and the deliverer; and, every 2 s, it takes
a vacant role and writes the loops' run records.
Several engines (processes, clusters, hosts) run at once: every claim is a conditional update.
"""

from __future__ import annotations

import logging
import math
import queue
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from operator import attrgetter

from django.conf import settings
from django.db import close_old_connections, connection

from core.db import pool_options
from core.db.wakeups import Channel, wakeups
from core.env import SettingsError
from core.fairness import round_robin
from core.ids import utcnow
from delivery.runner import Deliverer
from execution.outcomes import ErrorKind, Outcome
from execution.services import Attempt
from orchestration.services import CallKey
from timer.selectors import DueTimer
from workers.gate import WriteGate
from workers.keeper import SessionKeeper
from workers.loops import Loop, Where, registered
from workers.loops.backlog import BACKLOG_MIN_CLAIM
from workers.pipeline import START_CHUNK, run_attempt, start_and_claim, until_start
from workers.services import RunRecorder
from workers.shares import FairShares

logger = logging.getLogger("serviceagent.engine")

tenant_of = attrgetter("tenant_id")

# The GIL switch interval in the engine's process (see Engine.start).
SWITCH_INTERVAL_SECONDS = 0.001
# How often every engine looks for a vacant role and writes its loops' run records.
UPKEEP_SECONDS = 2.0


class Reservation:
    """Free threads of the pool taken for one claim (Engine.reserve), and how many of them each
    tenant was given so far (Engine.take_slot)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.tenants: Counter[str] = Counter()

    def __bool__(self) -> bool:
        return self.size > 0


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
        self.min_claim = min(BACKLOG_MIN_CLAIM, self.concurrency)
        self.stop_event = threading.Event()
        # When a stopping engine stops waiting for its threads (Engine.stop).
        self.stop_deadline = math.inf
        self.recorder = RunRecorder(session_id=keeper.session_id)
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="attempt")
        self.results: queue.Queue[tuple[Attempt, Outcome]] = queue.Queue()
        self.in_flight = 0
        # Of those, attempts waiting in their thread for their start (started ahead): not sending.
        self.waiting = 0
        self._in_flight_lock = threading.Lock()
        # The pool's threads shared among tenants (docs/flow-control.md, "Fair shares").
        self.shares = FairShares(size=self.concurrency, per_tenant=settings.EXECUTION_PER_TENANT)
        self.threads: list[threading.Thread] = []
        self.gate = WriteGate()
        # The delivery loop's, to which the dispatcher of this process hands the heads its
        # fan-out makes; a new one whenever that loop starts again.
        self.deliverer = self.new_deliverer()
        # Every registered loop, by name; those of this process's roles run (self.running).
        self.loops: dict[str, Loop] = {loop.name: loop(self) for loop in registered()}
        self.running: list[Loop] = []
        self._check_pool()

    def db_connections(self) -> int:
        """Connections this process holds at most with every role: one for each loop's thread,
        the upkeep's, the session heartbeat's (workers/keeper.py) and django-q2's task thread.
        The attempts' and the deliveries' threads use none (docs/deploy.md, "Connections")."""
        return len(self.loops) + 3

    def _check_pool(self) -> None:
        """A pool smaller than that would leave a loop waiting for a connection, then failing."""
        options = pool_options()
        if options is not None and options["max_size"] < self.db_connections():
            raise SettingsError(
                f"the database pool holds {options['max_size']} connections, and this worker's engine needs "
                f"{self.db_connections()} (one per thread that uses the database, {len(self.loops)} loops "
                "among them): raise WORKER_DB_POOL_SIZE (docs/deploy.md, 'Connections')"
            )

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def session_id(self) -> str:
        return self.keeper.session_id

    def start(self) -> None:
        # Every SQLite call releases the GIL; getting it back behind a busy thread takes up to
        # the switch interval (5 ms by default), so a transaction of a few dozen statements
        # could hold the write lock for 100 ms while its thread queues for the GIL.
        sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
        wakeups.start()  # the loops sleep until a commit makes work for them
        self._start_loops(Where.EVERY_WORKER)
        self._start_thread("upkeep", self._upkeep)
        if self.hosts_timer:
            self._start_loops(Where.TIMER_HOME)
        if self.hosts_events:
            self._start_loops(Where.EVENTS_HOME)
        logger.info(
            "engine started",
            extra={"workerSession": self.session_id, "timer": self.hosts_timer, "events": self.hosts_events},
        )

    def _start_loops(self, where: Where) -> None:
        for loop in self.loops.values():
            if loop.where is where:
                self.running.append(loop)
                self._start_thread(loop.name, loop.run)

    def _start_thread(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=self._guarded(name, target), name=f"engine-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def _upkeep(self) -> None:
        while not self.stop_event.wait(UPKEEP_SECONDS):
            try:
                self._take_vacant_roles()
            except Exception:
                logger.exception("taking a vacant role failed")
            self.recorder.session_id = self.session_id
            with self.gate.slot():
                self.recorder.flush()

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
            self._start_loops(Where.TIMER_HOME)
        if not self.hosts_events and (not self.hosts_timer or self.single_worker) and self.take_role("events"):
            logger.warning("this worker took the vacant events role", extra={"workerSession": self.session_id})
            self.hosts_events = True
            self._start_loops(Where.EVENTS_HOME)

    def stop(self, *, drain_seconds: float = 10.0) -> None:
        """Stop taking work, let in-flight attempts finish (bounded), record, close the session."""
        if self.stop_event.is_set():
            return
        deadline = self.stop_deadline = time.monotonic() + drain_seconds
        self.stop_event.set()
        wakeups.wake_here(*Channel)  # the sleeping loops see the stop
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for thread in self.threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        try:
            for loop in self.loops.values():
                loop.finish()  # the recorder writes the outcomes still queued
            self.recorder.session_id = self.session_id
            self.recorder.flush(force=True)
            # Attempts still in flight stay Sending; the next watchdog interrupts them.
        except Exception:
            logger.exception("engine shutdown bookkeeping failed")
        finally:
            wakeups.stop()
            connection.close()
        logger.info("engine stopped", extra={"workerSession": self.session_id})

    def _guarded(self, name: str, target: Callable[[], None]) -> Callable[[], None]:
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

    def record_run(self, loop: str, *, started: float, items: int, error: BaseException | None = None) -> None:
        self.recorder.record(loop, started=started, items=items, error=error)

    def calls_finished(self, tenant_ids: Sequence[str]) -> None:
        """Outcomes of these tenants' calls were recorded: the running loops hear of it (the
        flow loop wakes when a limited tenant's call finished)."""
        for loop in tuple(self.running):
            loop.calls_finished(tenant_ids)

    # -- the execution pool: timer -> start -> execute ----------------------------------------
    def on_due(self, timers: list[DueTimer]) -> list[DueTimer]:
        """DueTimeReached for a batch: start the calls and hand their attempts to the pool.

        In chunks: the first requests go out while later calls are still being started, and
        the recorder and the dispatcher get the write lock between chunks. No more than the
        pool has room for: the rest stays Scheduled and due, and the backlog loops of every
        engine start it as their pools have room.

        The timer fires ahead (`TIMER_LEAD_MS`): the calls not due yet start now, their
        requests waiting in their threads until they are due (docs/architecture.md, "Started
        ahead, sent on time"). Returns the timers of calls not due yet that did not start
        (their rules are decided at their due time, or no thread was free): the timer fires
        them again when they are due.
        """
        now = utcnow()
        ahead = {timer.service_call_id for timer in timers if timer.due_at > now}
        ahead_until = max((timer.due_at for timer in timers), default=now)
        started: set[uuid.UUID] = set()
        pending = round_robin([CallKey(t.tenant_id, t.service_call_id) for t in timers], key=tenant_of)
        while pending:
            with self.reserve(min(START_CHUNK, len(pending))) as room:
                if not room:
                    self.wake_backlog()  # the backlog loops take over as their pools have room
                    break
                chunk, pending = self._admitted(pending, room)
                if chunk:
                    with self.gate.urgent():
                        attempts = start_and_claim(
                            chunk, worker_id=self.session_id, ahead=ahead, ahead_until=ahead_until
                        )
                    started.update(attempt.order.service_call_id for attempt in attempts)
                    self.execute(attempts, room=room)
        return [timer for timer in timers if timer.service_call_id in ahead and timer.service_call_id not in started]

    def wake_backlog(self) -> None:
        """Due calls are left for the backlog loops: this process's, and every other process's
        (docs/architecture.md, "Wake, don't poll")."""
        try:
            wakeups.wake_everywhere(Channel.BACKLOG)
        except Exception:  # they look by the clock anyway (BACKLOG_QUIET_RECHECK_SECONDS)
            logger.exception("waking the other processes' backlog loops failed")

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

    def full_tenants(self) -> list[str]:
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

    def give_back_slots(self, room: Reservation) -> None:
        """The threads of `room` its tenants were given for a start that rolled back: free for
        the next try (the backlog's one by one)."""
        with self._in_flight_lock:
            for tenant_id, count in (+room.tenants).items():
                self.shares.give_back(tenant_id, count)
            room.tenants.clear()

    def start_held(self, keys: list[CallKey]) -> int:
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
            self._wait_for_start(attempt)
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
            if room == self.min_claim or was_full:
                wakeups.wake_here(Channel.BACKLOG)
        self.results.put((attempt, outcome))

    # -- delivery to subscribers --------------------------------------------------------------
    def new_deliverer(self) -> Deliverer:
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

    def _wait_for_start(self, attempt: Attempt) -> None:
        """An attempt started ahead waits here for its start (counted apart: it sends nothing)."""
        pause = until_start(attempt.order)
        if pause:
            with self._in_flight_lock:
                self.waiting += 1
            try:
                time.sleep(pause)
            finally:
                with self._in_flight_lock:
                    self.waiting -= 1

    def _may_deliver(self) -> bool:
        """The events home delivers whenever notifications are due; every other engine only
        while its pool has no attempt sending (but those waiting for their start), so that
        during a burst its core goes to the calls (and the timer home's to the precise starts),
        and after it to the deliveries."""
        return self.hosts_events or self.in_flight == self.waiting
