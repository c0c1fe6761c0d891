"""The backlog loop: starts the due calls nobody has started yet (a burst bigger than the timer
home's pool, a timer that fired late), as this process's pool has room, so that a burst larger
than one pool is shared by every worker process of every cluster (docs/architecture.md, "Every
worker process executes").

Every worker process runs one.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from django.db import close_old_connections

from core.db import ChangeWatch
from core.db.wakeups import Channel
from core.ids import utcnow
from orchestration.selectors import service_calls_overdue, service_calls_overdue_count
from orchestration.services import CallKey
from workers.loops.base import Loop, Where
from workers.pipeline import START_CHUNK, start_and_claim, start_and_claim_overdue

if TYPE_CHECKING:
    from workers.engine import Engine, Reservation

logger = logging.getLogger("serviceagent.engine")

# A call due this long ago that nobody has started is anybody's; the loop looks that often (a
# read), and sooner when an attempt of this process finishes.
BACKLOG_GRACE_SECONDS = 0.02
BACKLOG_POLL_SECONDS = 0.02
# ... and claims once this many of its pool's threads are free (or all of a smaller pool), so a
# burst is started in chunks, not one write transaction per finished attempt; but with a thread
# free it never waits longer than this (a pool kept nearly full by slow calls).
BACKLOG_MIN_CLAIM = 16
BACKLOG_MAX_WAIT_SECONDS = 0.2
# With nothing overdue and nothing committed since, its looks are skipped; one reads at least
# this often, as calls fall due by the clock alone; while the wake-ups listen (PostgreSQL: a
# timer leaving due calls, room freed, wake it), the second.
BACKLOG_QUIET_RECHECK_SECONDS = 0.1
BACKLOG_LISTENING_RECHECK_SECONDS = 5.0
# A due call whose start failed in the backlog is left aside this long (logged), not retried in
# a tight loop; the others go on.
SET_ASIDE_SECONDS = 60.0


class BacklogLoop(Loop):
    """It claims once BACKLOG_MIN_CLAIM threads are free, so a burst is started in chunks; but
    never waits longer than BACKLOG_MAX_WAIT_SECONDS with a thread free, so a pool that slow calls
    keep nearly full (or a small one) still starts the backlog. A start that fails sets its calls
    aside for a while, one by one, so one bad row never stops the others."""

    name = "backlog"
    where = Where.EVERY_WORKER
    # A failed look ends the run; the engine starts the loop again a second later.
    failure = None

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        # Due calls whose start failed, until when they are left aside.
        self.set_aside: dict = {}

    def run(self) -> None:
        self.last_claim = time.monotonic()
        # Woken when a timer leaves due calls or room frees (core.db.ChangeWatch).
        self.watch = ChangeWatch(
            recheck=BACKLOG_QUIET_RECHECK_SECONDS,
            channel=Channel.BACKLOG,
            listening_recheck=BACKLOG_LISTENING_RECHECK_SECONDS,
        )
        super().run()

    def step(self) -> bool:
        engine = self.engine
        now = time.monotonic()
        for pk, until in list(self.set_aside.items()):
            if until <= now:
                del self.set_aside[pk]
        due_before = utcnow() - timedelta(seconds=BACKLOG_GRACE_SECONDS)
        free = engine.room()
        full = engine.full_tenants() if free else []
        # Only as many threads as calls wait: a reservation waits for the write lock, and the
        # threads it holds meanwhile are none of the timer's.
        overdue = free and self.watch.read(
            partial(
                service_calls_overdue_count,
                due_before=due_before,
                limit=START_CHUNK,
                exclude=list(self.set_aside),
                exclude_tenants=full,
            ),
            empty=0,
        )
        if overdue:
            at_least = engine.min_claim if now - self.last_claim < BACKLOG_MAX_WAIT_SECONDS else 1
            with engine.reserve(overdue, at_least=min(at_least, overdue)) as room:
                if room:
                    self.last_claim = now
                    started = self.start_overdue(due_before, room, full)
                    if started:
                        self.record(started=now, items=started)
                        return True
        elif free:
            self.last_claim = now  # nothing waits: the wait for a full chunk starts afresh
        return False

    def idle(self) -> None:
        # Until room frees or a timer leaves due calls (Engine.wake_backlog), or the recheck.
        self.watch.sleep(BACKLOG_POLL_SECONDS)

    def start_overdue(self, due_before: datetime, room: Reservation, full: list[str]) -> int:
        engine = self.engine
        exclude = list(self.set_aside)
        try:
            with engine.gate.slot():
                attempts = start_and_claim_overdue(
                    due_before=due_before,
                    limit=room.size,
                    exclude=exclude,
                    exclude_tenants=full,
                    take_slot=partial(engine.take_slot, room),
                    worker_id=engine.session_id,
                )
        except Exception as exc:
            logger.exception("starting the due backlog failed; trying its calls one by one")
            self.record(started=time.monotonic(), items=0, error=exc)
            close_old_connections()
            engine.give_back_slots(room)  # nothing of the batch started
            attempts = []
            for tenant_id, pk in service_calls_overdue(
                due_before=due_before, limit=room.size, exclude=exclude, exclude_tenants=full
            ):
                key = CallKey(tenant_id, pk)
                if not engine.take_slot(room, tenant_id):
                    continue
                try:
                    with engine.gate.slot():
                        attempts += start_and_claim([key], worker_id=engine.session_id)
                except Exception:
                    logger.exception(
                        "starting a due call failed; set aside for %ss",
                        SET_ASIDE_SECONDS,
                        extra={"tenantId": key.tenant_id, "serviceCallId": str(key.service_call_id)},
                    )
                    close_old_connections()
                    self.set_aside[key.service_call_id] = time.monotonic() + SET_ASIDE_SECONDS
        engine.execute(attempts, room=room)
        return len(attempts)
