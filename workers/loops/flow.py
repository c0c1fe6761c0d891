"""The flow loop: starts the calls that flow control held, as soon as their limits have room
(docs/flow-control.md, 'The flow loop').

The timer home runs it (one per cluster). Each round reads, from indexes only, the tenants with held calls and
the room their limits seem to have, then starts each tenant's oldest held calls through the
same start as the timer (orchestration decides again under the tenant's lock, so two engines
racing start nothing twice and break no limit). While calls are held it polls every
FLOW_POLL_SECONDS, sleeps exactly until a rate limit's next start when that comes sooner, and
wakes at once when a call of a limited tenant finishes in this engine (other processes'
finishes are seen at the next poll). While none is held it sleeps until a start holds one (the
flow channel, core/db/wakeups.py).

FlowRounds is the loop's logic, one round at a time; FlowLoop runs it in the engine.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from django.db import close_old_connections

from core.db import ChangeWatch
from core.db.wakeups import Channel, wakeups
from orchestration.admission import flow_round, tenant_has_limits
from orchestration.services import CallKey
from workers.loops.base import Loop, Where

if TYPE_CHECKING:
    from workers.engine import Engine

logger = logging.getLogger("serviceagent.flow")

# How often the loop looks for held calls that may start (an index probe when there are none).
FLOW_POLL_SECONDS = 0.02
# Held calls of one tenant started per transaction, at most: each start transaction holds the
# write lock the timer's starts wait for.
FLOW_BATCH = 50
# After a round that failed (the database away), before the next one.
ERROR_PAUSE_SECONDS = 1.0
# With none held and no call held since, rounds are skipped; one reads at least this often.
QUIET_RECHECK_SECONDS = 1.0
LISTENING_RECHECK_SECONDS = 5.0

# Starts the given calls and hands their attempts to the execution pool; returns how many started.
Start = Callable[[list[CallKey]], int]


class FlowRounds:
    def __init__(
        self,
        start: Start,
        *,
        poll: float = FLOW_POLL_SECONDS,
        batch: int = FLOW_BATCH,
        on_run: Callable[..., None] | None = None,
    ) -> None:
        self.start = start
        self.poll = poll
        self.batch = batch
        self.on_run = on_run
        self._watch = ChangeWatch(
            recheck=QUIET_RECHECK_SECONDS, channel=Channel.FLOW, listening_recheck=LISTENING_RECHECK_SECONDS
        )

    def finished(self, tenant_ids: Iterable[str]) -> None:
        """Calls of these tenants finished: if any has limits, room may have freed."""
        if any(tenant_has_limits(tenant_id) for tenant_id in set(tenant_ids)):
            wakeups.wake_here(Channel.FLOW)

    def step(self) -> float:
        """One round; returns how long the loop may sleep."""
        started_at = time.monotonic()
        # Calls are held only by a start, which commits and wakes the flow channel: while none
        # has since a round found none held, none is (core.db.ChangeWatch).
        mark = self._watch.mark()
        if mark is None:
            return self._watch.seconds_quiet(self.poll)
        plan = flow_round(batch=self.batch)
        self._watch.done(mark, found=plan.held)
        if not plan.held:
            return self._watch.seconds_quiet(self.poll)
        started = 0
        for tenant_id, ids in plan.starts:
            started += self._start(tenant_id, ids)
        if self.on_run is not None:
            self.on_run("flow", started=started_at, items=started)
        pause = self.poll
        if plan.next_at is not None:
            pause = min(pause, max(0.0, plan.next_at - time.time()))
        # Started some: the tenant may have more room (a batch was the limit), look again soon.
        return 0.0 if started and any(len(ids) >= self.batch for _, ids in plan.starts) else pause

    def _start(self, tenant_id: str, ids: list[uuid.UUID]) -> int:
        try:
            return self.start([CallKey(tenant_id, pk) for pk in ids])
        except Exception as exc:
            # One tenant's failing start must not stop the others'; its calls stay held and
            # are tried again at the next round, never in a tight loop (the poll paces it).
            logger.exception("starting %d held calls failed", len(ids), extra={"tenantId": tenant_id})
            if self.on_run is not None:
                self.on_run("flow", started=time.monotonic(), items=0, error=exc)
            return 0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            seen = wakeups.seen_now(Channel.FLOW)
            looked = time.monotonic()
            try:
                pause = self.step()
            except Exception as exc:
                logger.exception("flow round failed")
                if self.on_run is not None:
                    self.on_run("flow", started=time.monotonic(), items=0, error=exc)
                close_old_connections()
                pause = ERROR_PAUSE_SECONDS
            if pause > 0:
                wakeups.wait(Channel.FLOW, seen=seen, timeout=pause)
                # Woken during a burst: no sooner than a poll after the last round.
                time.sleep(max(0.0, min(pause, self.poll) - (time.monotonic() - looked)))


class FlowLoop(Loop):
    name = "flow"
    where = Where.TIMER_HOME

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        # Held calls start within their tenant's fair share of the pool (Engine.start_held).
        self.rounds = FlowRounds(engine.start_held, on_run=engine.record_run)

    def run(self) -> None:
        # Its rounds sleep on a wake of their own, set when calls of a limited tenant finish.
        self.rounds.run(self.engine.stop_event)

    def calls_finished(self, tenant_ids: Sequence[str]) -> None:
        self.rounds.finished(tenant_ids)
