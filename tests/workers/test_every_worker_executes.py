"""Every worker process executes attempts (docs/architecture.md, "Every worker process
executes"): a burst larger than one pool is shared by the cluster's workers, each call once."""

from datetime import timedelta

import pytest
from django.test import override_settings

from core.db import ChangeWatch
from core.ids import utcnow
from execution.models import HttpExecution
from orchestration.models import ServiceCall
from orchestration.services import service_calls_start_overdue
from tests.support.factories import make_call
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster
from timer.models import TimerSchedule
from timer.selectors import DueTimer
from workers.models import LoopRun, WorkerSession


@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_a_burst_is_executed_by_both_worker_processes_each_call_once(world, http_target, tmp_path):
    # Pools of 2 threads and calls that take 300 ms: the timer home alone would need 6 s.
    c = Cluster(tmp_path, EXECUTION_CONCURRENCY="2").start()
    try:
        wait_for(lambda: WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING).count() >= 2, timeout=10)
        calls = [make_call(name=f"burst-{n}", url=http_target.url("/delay/300"), due_in=2) for n in range(40)]
        wait_for(
            lambda: ServiceCall.objects.filter(pk__in=[call.pk for call in calls], status="Succeeded").count() == 40,
            timeout=30,
        )
        # The lock files of both roles, held by two different worker processes.
        assert len(list(tmp_path.glob("engine-*.lock"))) == 1
        assert len(list(tmp_path.glob("events-*.lock"))) == 1
    finally:
        c.stop()
    assert http_target.count("/delay/300") == 40  # each call sent once
    assert set(ServiceCall.objects.filter(pk__in=[call.pk for call in calls]).values_list("attempts", flat=True)) == {1}
    executed_by = set(
        HttpExecution.objects.filter(service_call_id__in=[call.pk for call in calls]).values_list(
            "worker_id", flat=True
        )
    )
    assert len(executed_by) == 2, executed_by  # both worker processes' sessions
    # The timer home and the events home are different processes.
    timer_home = set(LoopRun.objects.filter(loop="timer").values_list("session_id", flat=True))
    events_home = set(LoopRun.objects.filter(loop="dispatch").values_list("session_id", flat=True))
    assert timer_home and events_home and not timer_home & events_home


def test_the_backlog_starts_due_unheld_calls_oldest_first_within_its_limit(db, world):
    now = utcnow()
    oldest = make_call(name="oldest", due_at=now - timedelta(seconds=3))
    older = make_call(name="older", due_at=now - timedelta(seconds=2))
    recent = make_call(name="recent", due_at=now - timedelta(seconds=1))
    make_call(name="future", due_in=60)
    held = make_call(name="held", due_at=now - timedelta(seconds=5))
    ServiceCall.objects.filter(pk=held.pk).update(held_since=now, held_queue="q")

    started = service_calls_start_overdue(due_before=utcnow(), limit=2)
    assert [call.service_call_id for call in started] == [oldest.pk, older.pk]
    started = service_calls_start_overdue(due_before=utcnow(), limit=10)
    assert [call.service_call_id for call in started] == [recent.pk]
    assert service_calls_start_overdue(due_before=utcnow(), limit=10) == []
    statuses = dict(ServiceCall.objects.values_list("name", "status"))
    assert statuses == {
        "oldest": "Running",
        "older": "Running",
        "recent": "Running",
        "future": "Scheduled",
        "held": "Scheduled",
    }


def test_the_timer_starts_no_more_calls_than_its_pool_has_room_for(transactional_db, world, http_target):
    """A claimed attempt leaves at once: one queued behind a full pool would be Interrupted, not
    resent, if the process died. The rest stays Scheduled and due, for any backlog loop."""
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    calls = [make_call(name=f"c{n}", url=http_target.url("/delay/500")) for n in range(6)]
    keeper = SessionKeeper()
    with override_settings(EXECUTION_CONCURRENCY=2):
        engine = Engine(keeper)
    try:
        engine.on_due([DueTimer(n, c.tenant_id, c.pk, c.due_at, c.correlation_id) for n, c in enumerate(calls)])
        assert ServiceCall.objects.filter(status="Running").count() == 2
        assert ServiceCall.objects.filter(status="Scheduled").count() == 4
        assert engine.room() == 0
    finally:
        engine.stop(drain_seconds=5)
        keeper.close()
    assert not HttpExecution.objects.filter(state=HttpExecution.State.SENDING).exists()


def _handed_over(call):
    """As the timer leaves a call it had no room for: Scheduled and due, its timer Reached."""
    TimerSchedule.objects.filter(service_call_id=call.pk).update(state=TimerSchedule.State.REACHED, reached_at=utcnow())


def _engine(concurrency: int, per_tenant: int | None = None):
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    keeper = SessionKeeper()
    with override_settings(EXECUTION_CONCURRENCY=concurrency, EXECUTION_PER_TENANT=per_tenant or concurrency):
        engine = Engine(keeper)
    return keeper, engine


def test_a_nearly_full_pool_still_starts_the_backlog_soon(transactional_db, world, http_target):
    """The backlog loop waits for a chunk's worth of free threads, but never long: with one
    slow call holding a pool of 2, a handed-over call still starts within a second."""
    keeper, engine = _engine(2)
    engine.start()
    try:
        slow = make_call(name="slow", url=http_target.url("/delay/3000"))
        wait_for(lambda: ServiceCall.objects.get(pk=slow.pk).status == "Running", timeout=5)
        waiting = make_call(name="waiting", url=http_target.url("/ok"))
        _handed_over(waiting)
        done = wait_for(lambda: (c := ServiceCall.objects.get(pk=waiting.pk)).is_terminal and c, timeout=2)
        assert done.status == "Succeeded"
        assert ServiceCall.objects.get(pk=slow.pk).status == "Running"  # it never waited for the slow one
    finally:
        engine.stop(drain_seconds=5)
        keeper.close()


def test_the_backlog_takes_only_as_many_threads_as_calls_wait(transactional_db, world, http_target, monkeypatch):
    """Its threads are reserved before it waits for the write lock, and meanwhile they are none of
    the timer's: with two calls overdue it takes two of eight, so the timer still has room."""
    keeper, engine = _engine(8)
    for n in range(2):
        _handed_over(make_call(name=f"overdue {n}", url=http_target.url("/ok")))
    ServiceCall.objects.update(due_at=utcnow() - timedelta(seconds=1))
    wanted = []
    reserve = engine.reserve
    monkeypatch.setattr(engine, "reserve", lambda size, **kw: wanted.append((size, kw)) or reserve(size, **kw))
    loop = engine.loops["backlog"]
    try:
        loop.last_claim = 0.0  # waited long enough: a chunk of any size
        loop.watch = ChangeWatch(recheck=0.1)
        assert loop.step()
        assert wanted == [(2, {"at_least": 1})]
        assert ServiceCall.objects.filter(status__in=["Running", "Succeeded"]).count() == 2
    finally:
        engine.stop(drain_seconds=5)
        keeper.close()


@pytest.mark.parametrize("per_tenant", [None, 2], ids=["whole pool", "a share of 2 threads"])
def test_a_call_whose_start_fails_is_set_aside_and_the_backlog_goes_on(
    transactional_db, world, http_target, per_tenant
):
    """Also when the tenant's share is as small as the failed batch: the threads its calls were
    given for the start that rolled back are theirs again for the one-by-one tries."""
    keeper, engine = _engine(8, per_tenant)
    now = utcnow()
    bad = make_call(name="bad", url=http_target.url("/ok"), due_at=now - timedelta(seconds=2))
    good = make_call(name="good", url=http_target.url("/ok"), due_at=now - timedelta(seconds=1))
    for call in (bad, good):
        _handed_over(call)
    # A row no start can read (as an edit by hand could leave it): its request has no method.
    spec = dict(ServiceCall.objects.get(pk=bad.pk).request_spec)
    del spec["method"]
    ServiceCall.objects.filter(pk=bad.pk).update(request_spec=spec)
    engine.start()
    try:
        done = wait_for(lambda: (c := ServiceCall.objects.get(pk=good.pk)).is_terminal and c, timeout=5)
        assert done.status == "Succeeded"
        assert ServiceCall.objects.get(pk=bad.pk).status == "Scheduled"
        assert bad.pk in engine.loops["backlog"].set_aside
    finally:
        engine.stop(drain_seconds=5)
        keeper.close()


def test_an_engine_takes_a_role_whose_lock_it_finds_free(transactional_db, world):
    """A replacement worker spawned before its predecessor died found the events lock held and
    took no role; once the lock is free it takes the role and starts the role's loops."""
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    vacant = {"events"}
    keeper = SessionKeeper()
    engine = Engine(keeper, timer=False, events=False, take_role=lambda role: role in vacant, single_worker=False)
    try:
        engine._take_vacant_roles()
        names = {thread.name for thread in engine.threads}
        assert engine.hosts_events and not engine.hosts_timer
        assert "engine-dispatch" in names
        assert "engine-timer" not in names
    finally:
        engine.stop(drain_seconds=1)
        keeper.close()
