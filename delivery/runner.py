"""The delivery loop's step: claim due notifications, try each on a worker thread (no
transaction is open while a request is out), record the results as they come back. A slow
or dead subscriber holds one thread per notification in flight, never the others' deliveries
(docs/events.md)."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext

from django.db import DatabaseError, close_old_connections, transaction

from delivery.models import Subscription
from delivery.selectors import notifications_due_exist
from delivery.senders import send, send_nats_many
from delivery.services import (
    ClaimedNotification,
    SendResult,
    notifications_claim,
    notifications_record,
    notifications_release,
)

logger = logging.getLogger("serviceagent.delivery")

# Tries at recording one batch of results before its notifications are left to their lease.
RECORD_TRIES = 3


class Deliverer:
    def __init__(
        self,
        *,
        concurrency: int,
        batch_size: int,
        per_subscription: int | None = None,
        write_guard: Callable[[], AbstractContextManager[None]] = nullcontext,
        may_claim: Callable[[], bool] | None = None,
    ) -> None:
        self.concurrency = concurrency
        # Asked before each claim: False leaves the due notifications to the other loops for now
        # (the engine's way of putting its own work first); results are still recorded.
        self.may_claim = may_claim or (lambda: True)
        self.batch_size = batch_size
        self.write_guard = write_guard
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="delivery")
        self.results: queue.Queue[tuple[ClaimedNotification, SendResult]] = queue.Queue()
        self.per_subscription = per_subscription
        self.in_flight = 0
        # Tries in flight per subscription: a slow receiver holds at most per_subscription threads.
        self.in_flight_by_subscription: Counter[uuid.UUID] = Counter()
        self._lock = threading.Lock()
        # Set when a try comes back, so an idle loop wakes for it at once instead of polling.
        self._came_back = threading.Event()
        # Tries handed to the pool and not yet done: those a stop cancels are given back.
        self._queued: dict[Future, list[ClaimedNotification]] = {}

    def step(self) -> int:
        """Record what came back and claim what is due and fits, in one write transaction, then
        start the claimed; returns how many notifications it moved (0: idle)."""
        ready = self._take_ready()
        with self._lock:
            room = self.concurrency - self.in_flight + len(ready)  # the recorded free their threads
            busy = Counter(self.in_flight_by_subscription)
        busy.subtract(n.subscription_id for n, _ in ready)
        limit = min(room, self.batch_size) if room > 0 and self.may_claim() and notifications_due_exist() else 0
        claimed: list[ClaimedNotification] = []
        try:
            if ready or limit:
                claimed = self._write(ready, limit=limit, busy=+busy)
        finally:
            self._release(ready)
        with self._lock:
            self.in_flight += len(claimed)
            self.in_flight_by_subscription.update(n.subscription_id for n in claimed)
        # Webhooks one per thread; NATS together, one publish batch (delivery/senders.py).
        nats = [n for n in claimed if n.subscription.kind == Subscription.Kind.NATS]
        tries = [[n] for n in claimed if n.subscription.kind != Subscription.Kind.NATS]
        for batch in [nats] + tries if nats else tries:
            future = self.pool.submit(self._try, batch)
            self._queued[future] = batch
            future.add_done_callback(self._forget)
        return len(ready) + len(claimed)

    def _forget(self, future: Future) -> None:
        self._queued.pop(future, None)

    def _try(self, batch: list[ClaimedNotification]) -> None:
        if len(batch) == 1:
            self.results.put((batch[0], send(batch[0])))
        else:
            for notification, result in zip(batch, send_nats_many(batch), strict=True):
                self.results.put((notification, result))
        self._came_back.set()

    def wait(self, timeout: float) -> None:
        """Sleep until a try comes back or `timeout` passes (new notifications are polled for)."""
        self._came_back.wait(timeout)
        self._came_back.clear()

    def gather(self, timeout: float) -> None:
        """After a step that moved something, while tries are out: wait up to `timeout` for a
        quarter of them to come back, so that one claim and one recording serve many
        notifications (each costs about the same for one notification as for fifty)."""
        with self._lock:
            want = self.in_flight // 4
        deadline = time.monotonic() + timeout
        while want and self.results.qsize() < want:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._came_back.wait(left)
            self._came_back.clear()

    def record_ready(self) -> int:
        """Record what came back (and claim nothing)."""
        ready = self._take_ready()
        try:
            if ready:
                self._write(ready, limit=0, busy=Counter())
        finally:
            self._release(ready)
        return len(ready)

    def _take_ready(self) -> list[tuple[ClaimedNotification, SendResult]]:
        ready = []
        while True:
            try:
                ready.append(self.results.get_nowait())
            except queue.Empty:
                return ready

    def _release(self, ready: list[tuple[ClaimedNotification, SendResult]]) -> None:
        """Whatever recording did, these tries are over: their threads are free again (an
        unrecorded try is sent again when its lease ends: at least once)."""
        with self._lock:
            self.in_flight -= len(ready)
            self.in_flight_by_subscription.subtract(n.subscription_id for n, _ in ready)
            self.in_flight_by_subscription += Counter()  # drop the zeros

    def _write(
        self, ready: list[tuple[ClaimedNotification, SendResult]], *, limit: int, busy: Counter[uuid.UUID]
    ) -> list[ClaimedNotification]:
        """Record `ready` and claim up to `limit` in one write transaction: every write a
        transaction, its turn and SQLite's lock, is paid once for both (a busy loop recorded and
        claimed many times a second). Tried again after a transient failure (a deadlock another
        cluster's transaction broke, a busy database): an unrecorded try would be sent again
        only after its lease."""
        for attempt in range(RECORD_TRIES):
            try:
                with self.write_guard(), transaction.atomic():
                    notifications_record(results=ready)
                    if not limit:
                        return []
                    return notifications_claim(limit=limit, in_flight=busy, per_subscription=self.per_subscription)
            except DatabaseError:
                if attempt == RECORD_TRIES - 1:
                    raise
                logger.warning("recording %d delivery tries failed; trying again", len(ready), exc_info=True)
                close_old_connections()
                time.sleep(0.05 * (attempt + 1))
        return []  # not reached: the last try returns or raises

    def idle(self) -> bool:
        with self._lock:
            return self.in_flight == 0

    def stop(self, *, timeout: float | None = None) -> None:
        """Start no new tries; give back the claimed ones no thread started yet (due again at
        once, for another loop); wait up to `timeout` (None: for as long as they take) for the
        tries out to come back, and record them. A try still out then is left to its lease
        and sent again when the lease ends (at least once, docs/events.md)."""
        queued = dict(self._queued)
        self.pool.shutdown(wait=False, cancel_futures=True)
        cancelled = [notification for future, batch in queued.items() if future.cancelled() for notification in batch]
        if cancelled:
            with self._lock:
                self.in_flight -= len(cancelled)
                self.in_flight_by_subscription.subtract(n.subscription_id for n in cancelled)
                self.in_flight_by_subscription += Counter()  # drop the zeros
            try:
                with self.write_guard():
                    notifications_release(notifications=cancelled)
            except Exception:  # left to their lease; the tries out are still waited for
                logger.exception("giving back %d untried deliveries failed", len(cancelled))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                self.record_ready()
            except Exception:  # these are left to their lease; the others are still recorded
                logger.exception("recording delivery tries at stop failed")
            left = None if deadline is None else deadline - time.monotonic()
            if self.idle() or (left is not None and left <= 0):
                break
            self._came_back.wait(0.05 if left is None else min(0.05, left))
            self._came_back.clear()
        if not self.idle():
            with self._lock:
                out = self.in_flight
            logger.warning("stopped with %d delivery tries out; they are tried again when their lease ends", out)


def deliver_now(*, limit: int = 100) -> int:
    """Claim, try and record one batch in this thread (commands and tests)."""
    claimed = notifications_claim(limit=limit)
    try:
        results = [(notification, send(notification)) for notification in claimed]
    except BaseException:
        notifications_release(notifications=claimed)
        raise
    notifications_record(results=results)
    return len(claimed)
