"""The watchdog: after a crash, every accepted call still reaches a terminal state.

- an attempt still Sending whose worker is dead, or that outlived its timeout plus the grace
  period, may have been sent: it is marked Interrupted and its call Failed (never resent);
- a Running call without any attempt was never sent: it is executed normally;
- a Running call whose attempt finished (the worker died before recording the call) is
  finished with the outcome the attempt log recorded;
- a Scheduled call long overdue without a pending timer gets its timer again;
- an event delivery claimed by a dead worker is given back, due again once any try of that
  worker is surely over (docs/events.md).
Attempts are the call's current one: an earlier attempt of a retried call is history.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings

from core.ids import utcnow
from delivery.services import notifications_release_dead_claims
from execution.models import HttpExecution
from execution.outcomes import Outcome
from execution.selectors import attempts_by_call, attempts_sending
from execution.services import Attempt, attempts_interrupt, outcome_of
from orchestration.selectors import service_calls_running
from orchestration.services import (
    CallKey,
    running_call_for_execution,
    service_calls_finish,
    service_calls_rearm_overdue,
)
from workers.pipeline import claim
from workers.services import live_session_ids, sessions_mark_stale

logger = logging.getLogger("serviceagent.watchdog")

# A Running call without an attempt row is left this long to the worker that started it.
CLAIM_GRACE = timedelta(seconds=2)
# A Scheduled call overdue this long without a pending timer gets its timer again.
OVERDUE_GRACE = timedelta(seconds=30)


def sweep(*, worker_id: str, execute: Callable[[list[Attempt]], None]) -> int:
    """One watchdog pass; returns how many calls it moved on."""
    now = utcnow()
    sessions_mark_stale(now=now)
    live = live_session_ids()
    grace = timedelta(milliseconds=settings.WATCHDOG_GRACE_MS)
    # A dead session's event deliveries: given back, not left to the end of their lease.
    released = notifications_release_dead_claims(live_sessions=live, looked_at=now)
    if released:
        logger.warning("gave back %d event deliveries claimed by dead workers", released)

    orphaned = [
        attempt
        for attempt in attempts_sending(limit=1000)
        if attempt.worker_id not in live
        or attempt.started_at + timedelta(milliseconds=attempt.timeout_ms) + grace < now
    ]
    interrupted = set(
        attempts_interrupt(
            execution_ids=[a.execution_id for a in orphaned],
            reason="the worker stopped while the request may have been sent; it is not sent again",
        )
    )
    moved = 0
    if interrupted:
        logger.warning("interrupted %d attempts of dead or stuck workers", len(interrupted))

    running = service_calls_running(started_before=now - CLAIM_GRACE, limit=1000)
    attempts = attempts_by_call(attempts=[(call.service_call_id, call.attempts) for call in running])
    to_finish: list[tuple[CallKey, Outcome]] = []
    never_sent = []
    for call in running:
        attempt = attempts.get(call.service_call_id)
        key = CallKey(call.tenant_id, call.service_call_id, call.attempts)
        if attempt is None:
            never_sent.append(key)
        elif attempt.state != HttpExecution.State.SENDING:
            to_finish.append((key, outcome_of(attempt)))
    moved += service_calls_finish(results=to_finish)
    if never_sent:
        started = [
            c
            for key in never_sent
            if (c := running_call_for_execution(tenant_id=key.tenant_id, service_call_id=key.service_call_id))
        ]
        claimed = claim(started, worker_id=worker_id)
        if claimed:
            logger.warning("executing %d calls left Running without an attempt", len(claimed))
            execute(claimed)
            moved += len(claimed)
    moved += service_calls_rearm_overdue(due_before=now - OVERDUE_GRACE)
    return moved
