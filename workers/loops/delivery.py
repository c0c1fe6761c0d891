"""The delivery loop: notifications to subscribers (docs/events.md), claimed (or handed over by
the dispatcher's fan-out), tried on the deliverer's own threads, recorded as they come back.

Every worker process runs one: the events home's delivers whenever notifications are due, the
others' only while their pool has no attempt in flight (Engine._may_deliver).
"""

from __future__ import annotations

import time

from django.conf import settings

from delivery.runner import Deliverer
from workers.loops.base import Loop, Where
from workers.loops.recorder import RECORD_GATHER_SECONDS

# How long a stopping delivery loop waits for its tries out to come back (Engine.stop's drain
# bound covers it).
DELIVERY_STOP_SECONDS = 5.0


class DeliveryLoop(Loop):
    name = "delivery"
    where = Where.EVERY_WORKER
    failure = "event delivery failed"

    def run(self) -> None:
        engine = self.engine
        self.poll = settings.DELIVERY_POLL_INTERVAL_MS / 1000
        if engine.deliverer.stopping:  # this loop ran before and stopped on an error: a fresh one
            engine.deliverer = engine.new_deliverer()
        self.deliverer: Deliverer = engine.deliverer
        try:
            super().run()
        finally:
            # The tries out come back and are recorded, within a bound and within the engine's
            # (Engine.stop waits that long for this thread); one still out then is sent again
            # after its lease.
            left = engine.stop_deadline - time.monotonic()
            self.deliverer.stop(timeout=max(0.0, min(DELIVERY_STOP_SECONDS, left)))

    def step(self) -> bool:
        started = time.monotonic()
        moved = self.deliverer.step()
        if not moved:
            return False
        self.record(started=started, items=moved)
        self.deliverer.gather(RECORD_GATHER_SECONDS)
        return True

    def idle(self) -> None:
        self.deliverer.wait(self.poll)
