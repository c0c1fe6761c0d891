"""Started ahead, sent on time (docs/architecture.md): the timer starts a call a moment before it
is due, and its request leaves when it is due, never before; calls whose rules are decided at
their due time (flow control's limits, a schedule's overlap policy) are not started ahead, nor
are calls a full pool has no thread for: their timers fire again when they are due."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import override_settings

from core.ids import iso_ms, utcnow
from execution.models import HttpExecution
from orchestration.models import ServiceCall
from orchestration.services import CallKey, service_calls_start
from outbox.models import OutboxEvent
from tests.support.factories import make_call, make_flow_control
from tests.support.schedules import calls_of, make_schedule
from tests.support.waiting import wait_for
from timer.scheduler import NearTermScheduler
from timer.selectors import DueTimer


def _timer(n: int, call: ServiceCall) -> DueTimer:
    return DueTimer(n, call.tenant_id, call.pk, call.due_at, call.correlation_id)


def _engine(concurrency: int = 8):
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    keeper = SessionKeeper()
    with override_settings(EXECUTION_CONCURRENCY=concurrency, EXECUTION_PER_TENANT=concurrency):
        engine = Engine(keeper)
    return keeper, engine


def test_a_call_started_ahead_leaves_at_its_due_time_never_before(transactional_db, world, http_target):
    due = utcnow() + timedelta(milliseconds=1500)  # well after the calls and the engine are made
    calls = [
        make_call(name=f"c{n}", url=http_target.url(f"/ok?n={n}"), due_at=due + timedelta(milliseconds=50 * n))
        for n in range(3)
    ]
    keeper, engine = _engine()
    try:
        left = engine.on_due([_timer(n, call) for n, call in enumerate(calls)])
        assert left == []
        # Started now, before they are due: Running, startedAt their due time, nothing sent yet.
        started_at = utcnow()
        for call in calls:
            row = ServiceCall.objects.get(pk=call.pk)
            assert row.status == ServiceCall.Status.RUNNING and row.started_at == call.due_at > started_at
            running = OutboxEvent.objects.get(aggregate_id=call.pk, event_type="ServiceCallRunning")
            assert running.event_payload["payload"]["startedAt"] == iso_ms(call.due_at)
        assert http_target.count("/ok") == 0
        wait_for(lambda: http_target.count("/ok") == 3, timeout=5)
    finally:
        engine.stop(drain_seconds=5)
        keeper.close()
    arrivals = {r["query"]: r["at"] for r in http_target.requests}
    for n, call in enumerate(calls):
        attempt = HttpExecution.objects.get(service_call_id=call.pk)
        # The attempt log's startedAt is the request's departure: at or after the due time, and
        # before the target saw it.
        assert call.due_at <= attempt.started_at
        assert call.due_at.timestamp() <= attempt.started_at.timestamp() <= arrivals[f"n={n}"]
        assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.SUCCEEDED


def test_calls_whose_rules_are_decided_at_their_due_time_are_handed_back(transactional_db, world, http_target):
    due = utcnow() + timedelta(seconds=1)
    plain = make_call("acme", name="plain", url=http_target.url("/ok"), due_at=due)
    limited = make_call("globex", name="limited", url=http_target.url("/ok"), due_at=due)
    make_flow_control("globex", parallelism=5)
    # A schedule's call: its overlap policy, a pause, a cancelOther decide at its due time.
    [overlapping] = calls_of(make_schedule(url=http_target.url("/ok"), overlap="allowAll"))
    ServiceCall.objects.filter(pk=overlapping.pk).update(due_at=due, name="schedule's")
    overlapping.due_at = due
    keeper, engine = _engine()
    try:
        left = engine.on_due([_timer(1, plain), _timer(2, limited), _timer(3, overlapping)])
        assert {timer.service_call_id for timer in left} == {limited.pk, overlapping.pk}
        statuses = dict(ServiceCall.objects.values_list("name", "status"))
        assert statuses == {"plain": "Running", "limited": "Scheduled", "schedule's": "Scheduled"}
    finally:
        engine.stop(drain_seconds=3)
        keeper.close()


def test_without_a_thread_free_a_call_not_due_yet_is_handed_back_and_a_due_one_left_to_the_backlog(
    transactional_db, world, http_target
):
    busy = make_call(name="busy", url=http_target.url("/delay/2000"))
    later = make_call(name="later", url=http_target.url("/ok"), due_at=utcnow() + timedelta(seconds=30))
    now = make_call(name="now", url=http_target.url("/ok"))
    keeper, engine = _engine(concurrency=1)
    try:
        assert engine.on_due([_timer(1, busy)]) == []
        assert engine.room() == 0
        left = engine.on_due([_timer(2, later), _timer(3, now)])
        assert [timer.service_call_id for timer in left] == [later.pk]  # the due one: any backlog loop's
        assert ServiceCall.objects.filter(status="Scheduled").count() == 2
    finally:
        engine.stop(drain_seconds=3)
        keeper.close()


def test_the_start_takes_only_calls_due_by_then(db, world):
    now = utcnow()
    soon = make_call(name="soon", due_at=now + timedelta(seconds=30))
    beyond = make_call(name="beyond", due_at=now + timedelta(seconds=90))
    keys = [CallKey(c.tenant_id, c.pk) for c in (soon, beyond)]
    assert service_calls_start(keys=keys) == []  # neither is due
    [started] = service_calls_start(keys=keys, ahead={soon.pk, beyond.pk}, ahead_until=now + timedelta(seconds=60))
    assert started.service_call_id == soon.pk
    assert started.not_before == soon.due_at  # its request waits for its due time
    assert ServiceCall.objects.get(pk=soon.pk).started_at == soon.due_at
    assert ServiceCall.objects.get(pk=beyond.pk).status == ServiceCall.Status.SCHEDULED


class Recorder:
    """A timer's receiver: when each batch came, and which timers it hands back."""

    def __init__(self, hand_back=frozenset()) -> None:
        self.fired: list[tuple[float, list[DueTimer]]] = []
        self.hand_back = set(hand_back)

    def __call__(self, batch: list[DueTimer]) -> list[DueTimer]:
        self.fired.append((time.time(), batch))
        later = [timer for timer in batch if timer.service_call_id in self.hand_back]
        self.hand_back -= {timer.service_call_id for timer in later}
        return later


def _run(scheduler: NearTermScheduler, until) -> None:
    deadline = time.monotonic() + 5
    while not until() and time.monotonic() < deadline:
        pause = scheduler.step()
        if pause:
            time.sleep(min(pause, 0.01))


@pytest.mark.parametrize("handed_back", [False, True], ids=["taken", "handed back"])
def test_the_scheduler_fires_a_batch_ahead_and_a_handed_back_timer_again_when_due(world, handed_back):
    now = utcnow()
    first = make_call(name="first", due_at=now + timedelta(milliseconds=600))
    second = make_call(name="second", due_at=now + timedelta(milliseconds=650))
    beyond = make_call(name="beyond", due_at=now + timedelta(milliseconds=900))
    receiver = Recorder(hand_back={second.pk} if handed_back else ())
    scheduler = NearTermScheduler(receiver, poll_interval=0.01, horizon=5, lead=0.1)
    _run(scheduler, lambda: sum(len(batch) for _, batch in receiver.fired) >= (4 if handed_back else 3))
    batches = [(at, [timer.service_call_id for timer in batch]) for at, batch in receiver.fired]
    # The first is fired `lead` before it is due, and the second (within twice that) with it.
    at, ids = batches[0]
    assert ids == [first.pk, second.pk]
    assert first.due_at.timestamp() - 0.2 <= at < first.due_at.timestamp()
    rest = batches[1:]
    if handed_back:  # fired again when it is due, not before
        [(again_at, again)] = [(at, ids) for at, ids in rest if second.pk in ids]
        assert again == [second.pk] and again_at >= second.due_at.timestamp()
    [(beyond_at, _)] = [(at, ids) for at, ids in rest if beyond.pk in ids]
    assert beyond.due_at.timestamp() - 0.2 <= beyond_at < beyond.due_at.timestamp()


def test_a_timer_handed_back_by_a_slow_start_past_its_due_time_is_fired_again_at_once(world):
    """The start that handed it back ran past its due time: fired again at once, never marked
    Reached unstarted (which would leave the call to the backlog's next look)."""
    call = make_call(name="slow start", due_at=utcnow() + timedelta(milliseconds=400))
    fired: list[float] = []

    def slow(batch: list[DueTimer]) -> list[DueTimer]:
        fired.append(time.time())
        if len(fired) == 1:
            time.sleep(max(0.0, call.due_at.timestamp() - time.time()) + 0.05)
            return batch
        return []

    scheduler = NearTermScheduler(slow, poll_interval=0.01, horizon=5, lead=0.1)
    _run(scheduler, lambda: len(fired) >= 2)
    assert len(fired) == 2 and fired[1] - fired[0] < 1.0
    assert fired[1] >= call.due_at.timestamp()
