"""The engine: the long-running loops of one worker process.

One engine runs per django-q2 cluster (see workers/signals.py), inside one of its worker
processes. It holds:
- the timer loop (NearTermScheduler) that starts due calls the moment they are due;
- an execution pool that performs attempts (HTTP outside any transaction);
- a recorder that writes finished attempts and call outcomes in small batches;
- the outbox dispatcher loop;
- the watchdog (crash recovery, stuck calls) and retention;
- records of its loop runs (the worker session itself is kept by SessionKeeper).
Several engines (clusters, hosts) may run at once: every claim is a conditional update.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection

from eventservice.ids import utcnow
from execution.outcomes import ErrorKind, Outcome
from execution.services import Attempt
from orchestration.services import CallKey
from outbox.dispatcher import dispatch_batch
from timer.scheduler import NearTermScheduler
from timer.selectors import DueTimer
from workers import recovery
from workers.keeper import SessionKeeper
from workers.pipeline import record, run_attempt, start_and_claim
from workers.services import RunRecorder, runs_delete_older_than

logger = logging.getLogger("serviceagent.engine")


class Engine:
    def __init__(self, keeper: SessionKeeper) -> None:
        self.keeper = keeper
        self.stop_event = threading.Event()
        self.recorder = RunRecorder(session_id=keeper.session_id)
        self.pool = ThreadPoolExecutor(settings.EXECUTION_CONCURRENCY, thread_name_prefix="attempt")
        self.results: queue.Queue[tuple[Attempt, Outcome]] = queue.Queue()
        self.in_flight = 0
        self._in_flight_lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.scheduler = NearTermScheduler(
            self.on_due,
            poll_interval=settings.TIMER_POLL_INTERVAL_MS / 1000,
            horizon=settings.TIMER_HORIZON_MS / 1000,
            batch_size=settings.TIMER_BATCH_SIZE,
            on_run=self._record_run,
        )

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def session_id(self) -> str:
        return self.keeper.session_id

    def start(self) -> None:
        for name, target in [
            ("timer", self._timer_loop), ("recorder", self._recorder_loop),
            ("dispatch", self._dispatch_loop), ("watchdog", self._watchdog_loop),
        ]:
            thread = threading.Thread(target=self._guarded(name, target), name=f"engine-{name}", daemon=True)
            thread.start()
            self.threads.append(thread)
        logger.info("engine started", extra={"workerSession": self.session_id})

    def stop(self, *, drain_seconds: float = 10.0) -> None:
        """Stop taking work, let in-flight attempts finish (bounded), record, close the session."""
        if self.stop_event.is_set():
            return
        self.stop_event.set()
        deadline = time.monotonic() + drain_seconds
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
        """DueTimeReached for a batch: start the calls and hand their attempts to the pool."""
        attempts = start_and_claim(
            [CallKey(t.tenant_id, t.service_call_id) for t in timers], worker_id=self.session_id
        )
        self.execute(attempts)

    def execute(self, attempts: list[Attempt]) -> None:
        for attempt in attempts:
            with self._in_flight_lock:
                self.in_flight += 1
            try:
                self.pool.submit(self._perform, attempt)
            except RuntimeError:  # pool shut down: the watchdog of the next session resolves it
                with self._in_flight_lock:
                    self.in_flight -= 1

    def _perform(self, attempt: Attempt) -> None:
        try:
            outcome = run_attempt(attempt)
        except Exception as exc:  # perform() never raises; this is a last line
            outcome = Outcome.failure(ErrorKind.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            with self._in_flight_lock:
                self.in_flight -= 1
        self.results.put((attempt, outcome))

    # -- recording outcomes in batches --------------------------------------------------------
    def _recorder_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                first = self.results.get(timeout=0.1)
            except queue.Empty:
                continue
            batch = [first]
            # Group commit: whatever finished meanwhile goes in the same transactions.
            while len(batch) < 500:
                try:
                    batch.append(self.results.get_nowait())
                except queue.Empty:
                    break
            self._record_batch(batch)

    def _record_batch(self, batch: list[tuple[Attempt, Outcome]]) -> None:
        started = time.monotonic()
        for attempt_number in range(5):
            try:
                record(batch)
                self._record_run("execution", started=started, items=len(batch))
                return
            except Exception as exc:
                logger.exception("recording %d outcomes failed (try %d)", len(batch), attempt_number + 1)
                self._record_run("execution", started=started, items=0, error=exc)
                close_old_connections()
                time.sleep(0.2 * (attempt_number + 1))
        # Left Sending: the watchdog turns them Interrupted rather than lose them silently.
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
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                published = dispatch_batch(limit=settings.OUTBOX_BATCH_SIZE)
            except Exception as exc:
                logger.exception("outbox dispatch failed")
                self._record_run("dispatch", started=started, items=0, error=exc)
                close_old_connections()
                self.stop_event.wait(1.0)
                continue
            self._record_run("dispatch", started=started, items=published)
            if not published:
                self.stop_event.wait(idle)

    # -- watchdog, retention, heartbeat -------------------------------------------------------
    def _watchdog_loop(self) -> None:
        next_retention = 0.0
        while not self.stop_event.wait(2.0):
            started = time.monotonic()
            try:
                moved = recovery.sweep(worker_id=self.session_id, execute=self.execute)
                self._record_run("watchdog", started=started, items=moved)
            except Exception as exc:
                logger.exception("watchdog sweep failed")
                self._record_run("watchdog", started=started, items=0, error=exc)
                close_old_connections()
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + 3600
                self._retention()
            self.recorder.session_id = self.session_id
            self.recorder.flush()

    def _retention(self) -> None:
        started = time.monotonic()
        try:
            deleted = runs_delete_older_than(before=utcnow() - timedelta(days=settings.RETENTION_DAYS))
            self._record_run("retention", started=started, items=deleted)
        except Exception as exc:
            logger.exception("retention failed")
            self._record_run("retention", started=started, items=0, error=exc)
