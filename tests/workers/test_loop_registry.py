"""The registry of the engine's loops (docs/architecture.md, "Adding a loop"): a loop registered
through it runs in the engines of the roles it names and has its runs recorded, with no migration
and no edit elsewhere; a run of a loop nobody registered is refused."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.core.management import call_command

from tests.support.waiting import wait_for
from workers.loops import Loop, Where, loop_names, register, registered, unregister
from workers.models import LoopRun
from workers.services import RunRecorder


class CountingLoop(Loop):
    """A test-only loop: every step counts one item, then it sleeps."""

    name = "test-counting"
    where = Where.EVERY_WORKER
    idle_seconds = 0.01

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.steps = 0

    def step(self) -> bool:
        self.steps += 1
        self.record(started=time.monotonic(), items=1)
        return False


class TimerHomeLoop(CountingLoop):
    name = "test-timer-home"
    where = Where.TIMER_HOME


@pytest.fixture
def fake_loops():
    register(CountingLoop)
    register(TimerHomeLoop)
    yield
    unregister(CountingLoop.name)
    unregister(TimerHomeLoop.name)


def test_a_registered_loop_runs_where_it_says_and_its_runs_are_recorded(transactional_db, fake_loops):
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    keeper = SessionKeeper()
    engine = Engine(keeper, timer=False, events=False)
    engine.start()
    try:
        counting = engine.loops["test-counting"]
        wait_for(lambda: counting.steps >= 3, timeout=5)
        names = {thread.name for thread in engine.threads}
        assert "engine-test-counting" in names
        assert "engine-test-timer-home" not in names  # this engine is not the timer home
        assert engine.loops["test-timer-home"].steps == 0
    finally:
        engine.stop(drain_seconds=1)
        keeper.close()
    run = LoopRun.objects.get(loop="test-counting", session_id=keeper.session_id)
    assert run.runs >= 3 and run.items == run.runs
    assert not LoopRun.objects.filter(loop="test-timer-home").exists()


def test_a_registered_loop_needs_no_migration(db, fake_loops):
    out = StringIO()
    call_command("makemigrations", "workers", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_a_run_of_a_loop_nobody_registered_is_refused(db):
    recorder = RunRecorder(session_id="none")
    with pytest.raises(ValueError, match="no loop named 'test-counting'"):
        recorder.record("test-counting", started=time.monotonic(), items=1)


def test_the_registry_refuses_a_name_taken_or_too_long():
    class Again(CountingLoop):
        name = "dispatch"

    class TooLong(CountingLoop):
        name = "a-name-longer-than-sixteen"

    class Nowhere(Loop):
        name = "test-nowhere"

    for loop in (Again, TooLong, Nowhere):
        with pytest.raises(ValueError):
            register(loop)
    assert {"timer", "execution", "dispatch", "delivery", "watchdog", "retention", "schedules", "flow", "backlog"} == (
        loop_names()
    )
    assert len(registered()) == 9
