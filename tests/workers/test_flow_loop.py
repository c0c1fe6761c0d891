"""The engine's flow loop (workers/loops/flow.py), one round at a time: it starts the oldest held calls
when their limits have room, through the same start as the timer (docs/flow-control.md)."""

from __future__ import annotations

from datetime import timedelta

from core.db.wakeups import Channel, wakeups
from core.ids import utcnow
from execution.outcomes import Outcome
from orchestration.models import ServiceCall
from orchestration.services import CallKey, service_call_finish, service_calls_start
from tests.support.factories import make_call, make_flow_control
from workers.loops.flow import FlowRounds
from workers.pipeline import start_and_claim

OK = Outcome(succeeded=True, status=200, headers={}, body_snippet="", latency_ms=1)


def _loop(started: list[list[CallKey]]) -> FlowRounds:
    def start(keys: list[CallKey]) -> int:
        started.append(keys)
        return len(start_and_claim(keys, worker_id="test-flow"))

    return FlowRounds(start, poll=0.02, batch=50)


def test_a_round_starts_the_oldest_held_call_once_there_is_room(world):
    make_flow_control("acme", parallelism=1)
    first = utcnow() - timedelta(seconds=1)
    calls = [make_call("acme", name=f"c{n}", due_at=first + timedelta(milliseconds=n)) for n in range(3)]
    service_calls_start(keys=[CallKey("acme", c.pk) for c in calls])
    started: list[list[CallKey]] = []
    loop = _loop(started)
    assert loop.step() == 0.02 and started == []  # no room: nothing tried
    assert service_call_finish(tenant_id="acme", service_call_id=calls[0].pk, outcome=OK)
    loop.step()
    assert [[key.service_call_id for key in keys] for keys in started] == [[calls[1].pk]]
    assert ServiceCall.objects.get(pk=calls[1].pk).status == ServiceCall.Status.RUNNING
    assert ServiceCall.objects.get(pk=calls[2].pk).held_since is not None


def test_without_held_calls_a_round_only_polls(world):
    started: list[list[CallKey]] = []
    assert _loop(started).step() == 0.02 and started == []


def test_a_finish_wakes_the_loop_only_for_a_limited_tenant(world):
    make_flow_control("acme", parallelism=1)
    loop = _loop([])
    seen = wakeups.seen_now(Channel.FLOW)
    loop.finished(["globex"])
    assert wakeups.seen_now(Channel.FLOW) == seen
    loop.finished(["globex", "acme"])
    assert wakeups.seen_now(Channel.FLOW) == seen + 1
