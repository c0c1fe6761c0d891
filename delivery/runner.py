"""The delivery loop's step: claim due notifications, try each on a worker thread (no
transaction is open while a request is out), record the results as they come back. A slow
or dead subscriber holds one thread per notification in flight, never the others' deliveries
(docs/events.md)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext

from delivery.models import Notification
from delivery.selectors import notifications_due_exist
from delivery.senders import send
from delivery.services import SendResult, notifications_claim, notifications_record, notifications_release


class Deliverer:
    def __init__(
        self,
        *,
        concurrency: int,
        batch_size: int,
        write_guard: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.write_guard = write_guard
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="delivery")
        self.results: queue.Queue[tuple[Notification, SendResult]] = queue.Queue()
        self.in_flight = 0
        self._lock = threading.Lock()
        # Set when a try comes back, so an idle loop wakes for it at once instead of polling.
        self._came_back = threading.Event()

    def step(self) -> int:
        """Record what came back, then claim and start what is due and fits; returns how many
        notifications it moved (0: idle)."""
        recorded = self.record_ready()
        with self._lock:
            room = self.concurrency - self.in_flight
        claimed: list[Notification] = []
        if room > 0 and notifications_due_exist():
            with self.write_guard():
                claimed = notifications_claim(limit=min(room, self.batch_size))
            with self._lock:
                self.in_flight += len(claimed)
            for notification in claimed:
                self.pool.submit(self._try, notification)
        return recorded + len(claimed)

    def _try(self, notification: Notification) -> None:
        self.results.put((notification, send(notification)))
        self._came_back.set()

    def wait(self, timeout: float) -> None:
        """Sleep until a try comes back or `timeout` passes (new notifications are polled for)."""
        self._came_back.wait(timeout)
        self._came_back.clear()

    def record_ready(self) -> int:
        ready = []
        while True:
            try:
                ready.append(self.results.get_nowait())
            except queue.Empty:
                break
        if ready:
            with self.write_guard():
                notifications_record(results=ready)
            with self._lock:
                self.in_flight -= len(ready)
        return len(ready)

    def idle(self) -> bool:
        with self._lock:
            return self.in_flight == 0

    def stop(self, *, wait: bool = True) -> None:
        """Finish the tries in flight (their results are recorded), start no new ones."""
        self.pool.shutdown(wait=wait, cancel_futures=True)
        self.record_ready()


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
