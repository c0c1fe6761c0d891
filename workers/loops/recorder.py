"""The recorder: the outcomes of the execution pool's attempts, written in small batches.

Every worker process runs one. Its runs are recorded as `execution` (the attempts it wrote).
"""

from __future__ import annotations

import logging
import queue
import time

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections

from execution.outcomes import Outcome
from execution.services import Attempt
from workers.loops.base import Loop, Where
from workers.pipeline import record

logger = logging.getLogger("serviceagent.engine")

# How long the recorder waits for more outcomes before writing a batch, and the most it
# writes in one transaction (each holds the write lock the timer and the dispatcher wait for).
RECORD_GATHER_SECONDS = 0.01
RECORD_BATCH = 100
# A batch that cannot be written is tried this many times, a second apart at most; while the
# database is unreachable, for WATCHDOG_GRACE_MS.
RECORD_TRIES = 5
RECORD_RETRY_MAX_SECONDS = 1.0
# How long a step waits for a first outcome (an outcome ends the wait at once; a stopping
# engine waits for it).
RECORD_WAIT_SECONDS = 0.5


class RecorderLoop(Loop):
    name = "recorder"
    recorded_as = "execution"
    where = Where.EVERY_WORKER
    failure = None

    def step(self) -> bool:
        results = self.engine.results
        try:
            first = results.get(timeout=RECORD_WAIT_SECONDS)
        except queue.Empty:
            return False
        batch = [first]
        # Group commit: what finishes within a few milliseconds goes in the same
        # transaction (one write lock for many outcomes instead of one each).
        gather_until = time.monotonic() + RECORD_GATHER_SECONDS
        while len(batch) < RECORD_BATCH:
            try:
                batch.append(results.get(timeout=max(0.0, gather_until - time.monotonic())))
            except queue.Empty:
                break
        self.record_batch(batch)
        return True

    def idle(self) -> None:
        """The step's wait for a first outcome was the sleep."""

    def record_batch(self, batch: list[tuple[Attempt, Outcome]]) -> None:
        started = time.monotonic()
        tries = 0
        while True:
            try:
                with self.engine.gate.slot():
                    record(batch)
                self.record(started=started, items=len(batch))
                self.engine.calls_finished([attempt.order.tenant_id for attempt, _ in batch])
                return
            except Exception as exc:
                tries += 1
                logger.exception("recording %d outcomes failed (try %d)", len(batch), tries)
                self.record(started=started, items=0, error=exc)
                close_old_connections()
                unreachable = isinstance(exc, OperationalError | InterfaceError)
                if len(batch) > 1 and not unreachable:
                    # One bad outcome must not sink the others (other tenants' among them):
                    # record each in a transaction of its own.
                    for one in batch:
                        self.record_batch([one])
                    return
                # The database gone (restarting, failing over to a standby: docs/deploy.md,
                # "High availability"): the batch is written again until the watchdog would take
                # its attempts for lost anyway.
                outage_left = settings.WATCHDOG_GRACE_MS / 1000 - (time.monotonic() - started)
                if tries >= RECORD_TRIES and not (unreachable and outage_left > 0):
                    break
                time.sleep(min(RECORD_RETRY_MAX_SECONDS, 0.2 * tries))
        # Left Sending: the watchdog turns it Interrupted rather than lose it silently.
        logger.error("gave up recording %d outcomes", len(batch))

    def finish(self) -> None:
        """The outcomes still queued when the engine stopped."""
        batch = []
        while True:
            try:
                batch.append(self.engine.results.get_nowait())
            except queue.Empty:
                break
        if batch:
            self.record_batch(batch)
