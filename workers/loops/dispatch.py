"""The outbox dispatcher: publishes the outbox's events to the configured sinks, its fan-out
handing the notifications it makes to this process's delivery loop (docs/events.md).

The events home runs it (one per cluster).
"""

from __future__ import annotations

import time

from django.conf import settings

from core.db import ChangeWatch
from core.db.wakeups import Channel
from delivery.fanout import NotificationSink
from delivery.services import nats_subscription_ensure
from outbox.dispatcher import dispatch_batch
from outbox.sinks import configured_sinks
from workers.loops.base import Loop, Where

# Outbox events claimed per dispatch transaction, at most (OUTBOX_BATCH_SIZE may be smaller):
# a due timer waits for the transaction in progress, so none may be long.
DISPATCH_CHUNK = 100
# With nothing to publish and nothing committed since, the dispatcher's looks are skipped; one
# reads at least this often (a publication that failed is tried again by the clock), and while
# the wake-ups listen (PostgreSQL), at least the second.
DISPATCH_QUIET_RECHECK_SECONDS = 0.5
DISPATCH_LISTENING_RECHECK_SECONDS = 5.0
# For this long after it last published, the dispatcher polls as it did before the wake-ups
# (a wake may trail its commit); after that it sleeps until one.
DISPATCH_BUSY_SECONDS = 2.0


class DispatchLoop(Loop):
    name = "dispatch"
    where = Where.EVENTS_HOME
    failure = "outbox dispatch failed"

    def run(self) -> None:
        self.poll = settings.OUTBOX_POLL_INTERVAL_MS / 1000
        self.limit = min(settings.OUTBOX_BATCH_SIZE, DISPATCH_CHUNK)
        with self.engine.gate.slot():
            nats_subscription_ensure()
        self.published = 0
        self.published_at = -DISPATCH_BUSY_SECONDS
        # Events are made by commits, which wake the outbox channel; but a failed publication, or
        # a dead dispatcher's lease, falls due by the clock: a skipped look (core.db.ChangeWatch)
        # is made up within DISPATCH_QUIET_RECHECK_SECONDS (listening, DISPATCH_LISTENING_RECHECK_SECONDS).
        self.watch = ChangeWatch(
            recheck=DISPATCH_QUIET_RECHECK_SECONDS,
            channel=Channel.OUTBOX,
            listening_recheck=DISPATCH_LISTENING_RECHECK_SECONDS,
        )
        super().run()

    def step(self) -> bool:
        started = time.monotonic()
        gate = self.engine.gate
        # Behind (its last batch was full): ahead of the other writers but the timer, as
        # every delivery waits for its fan-out; caught up, in turn with them.
        guard = gate.early if self.published >= self.limit else gate.slot
        # The fan-out makes the heads it can claimed for this process's delivery loop, which
        # takes them as the batch commits: an event's first tries start with its fan-out,
        # not at the loop's next poll and write.
        deliverer = self.engine.deliverer
        sinks = tuple(
            NotificationSink(offer=deliverer.offer) if isinstance(sink, NotificationSink) else sink
            for sink in configured_sinks()
        )
        if self.busy():
            self.watch.forget()
        try:
            published = dispatch_batch(limit=self.limit, write_guard=guard, sinks=sinks, watch=self.watch)
        finally:
            deliverer.offers_done()  # the room not taken given back at once, the taken tried
        self.published = published
        if published:
            self.published_at = time.monotonic()
        self.record(started=started, items=published)
        return published >= self.limit

    def busy(self) -> bool:
        return time.monotonic() - self.published_at < DISPATCH_BUSY_SECONDS

    def idle(self) -> None:
        if self.published or self.busy():
            # Caught up: let events gather for one poll interval rather than take the write lock
            # twice for every few events (lag stays within that interval).
            self.engine.stop_event.wait(self.poll)
        else:  # until events are appended
            self.watch.sleep(self.poll)
