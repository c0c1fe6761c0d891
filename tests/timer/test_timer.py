"""Durable timers: idempotent registration, never re-armed once reached, indexed due query."""

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from tests.support.factories import make_call
from tests.support.plans import query_plan, recorded_queries, selects_from
from timer import scheduler as scheduler_module
from timer.models import TimerSchedule
from timer.scheduler import NearTermScheduler
from timer.selectors import DueTimer, timers_due_before
from timer.services import timer_register, timers_mark_reached


def test_registering_twice_keeps_one_timer_and_moves_its_due_time(world):
    call = make_call(due_in=60)
    later = datetime.now(UTC) + timedelta(hours=1)
    assert timer_register(tenant_id="acme", service_call_id=call.pk, due_at=later, correlation_id="c")
    assert TimerSchedule.objects.filter(service_call=call).count() == 1
    assert TimerSchedule.objects.get(service_call=call).due_at == later


def test_a_reached_timer_is_never_re_armed(world):
    call = make_call(due_in=60)
    timer = TimerSchedule.objects.get(service_call=call)
    assert timers_mark_reached(ids=[timer.pk]) == 1
    assert timers_mark_reached(ids=[timer.pk]) == 0  # a duplicate fire changes nothing
    assert not timer_register(tenant_id="acme", service_call_id=call.pk, due_at=datetime.now(UTC), correlation_id="c")
    timer.refresh_from_db()
    assert timer.state == TimerSchedule.State.REACHED and timer.reached_at is not None


def test_the_scheduler_fires_due_timers_once_and_marks_them_reached(world):
    due = make_call(due_in=0.2)
    later = make_call(due_in=30)
    fired = []
    scheduler = NearTermScheduler(lambda batch: fired.extend(batch), poll_interval=0.01, horizon=5)
    deadline = datetime.now(UTC) + timedelta(seconds=3)
    while datetime.now(UTC) < deadline and not fired:
        pause = scheduler.step()
        if pause:
            time.sleep(min(pause, 0.05))
    assert [t.service_call_id for t in fired] == [due.pk]
    assert fired and datetime.now(UTC) >= fired[0].due_at
    assert TimerSchedule.objects.get(service_call=due).state == TimerSchedule.State.REACHED
    assert TimerSchedule.objects.get(service_call=later).state == TimerSchedule.State.SCHEDULED


def test_a_failing_receiver_sets_the_timer_aside_instead_of_spinning(world):
    make_call(due_in=0)
    calls = []

    def broken(batch):
        calls.append(len(batch))
        raise RuntimeError("downstream is broken")

    scheduler = NearTermScheduler(broken, poll_interval=0.01, horizon=5)
    for _ in range(20):
        scheduler.step()
    # One batch try plus one single try, then the timer waits (backoff: 1 s, far longer than
    # the 20 steps), not 20 tries. Exactly these two: no try at all would prove nothing.
    assert calls == [1, 1]
    assert TimerSchedule.objects.get().state == TimerSchedule.State.SCHEDULED


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's EXPLAIN QUERY PLAN")
def test_the_due_query_uses_the_partial_pending_index(world):
    make_call(due_in=60)
    # The query the scheduler's full refresh runs, recorded from the selector itself.
    with recorded_queries() as queries:
        due = timers_due_before(until=datetime.now(UTC) + timedelta(days=1))
    [(sql, params)] = selects_from(queries, "timer_schedules")
    plan = " | ".join(query_plan(sql, params))
    assert "USING INDEX timer_schedules_pending" in plan, plan
    assert "TEMP B-TREE" not in plan, plan
    assert len(due) == 1


def test_the_feed_reads_what_the_orm_reads_with_aware_due_times(world):
    """The feed's statement is written once per process (core.db.sql_query): it must give the
    rows, order and values of the ORM query it replaces, due times aware in UTC (the heap
    orders by their timestamp), on the full refresh and on the incremental feed."""
    calls = [make_call("acme" if n % 2 else "globex", name=f"c{n}", due_in=60 - n) for n in range(6)]
    reached = TimerSchedule.objects.get(service_call=calls[0])
    timers_mark_reached(ids=[reached.pk])
    until = datetime.now(UTC) + timedelta(seconds=58)  # leaves out the two due latest
    pending = TimerSchedule.objects.filter(state=TimerSchedule.State.SCHEDULED, due_at__lte=until)
    fields = ("id", "tenant_id", "service_call_id", "due_at", "correlation_id")

    full = timers_due_before(until=until)
    assert [tuple(vars(t).values()) for t in full] == list(pending.order_by("due_at").values_list(*fields))
    assert len(full) == 4 and all(t.due_at.utcoffset() == timedelta(0) for t in full)

    after = min(t.id for t in full)
    new = timers_due_before(until=until, after_id=after, limit=2)
    assert [tuple(vars(t).values()) for t in new] == list(
        pending.filter(id__gt=after).order_by("id").values_list(*fields)[:2]
    )


def test_the_full_refresh_reads_only_the_timers_not_yet_known(world):
    """The full refresh reads every timer of the horizon; those already on the heap are left out
    before their values are read, the others come back as without `known`."""
    calls = [make_call(name=f"c{n}", due_in=30 + n) for n in range(4)]
    until = datetime.now(UTC) + timedelta(minutes=1)
    every = timers_due_before(until=until)
    assert [t.service_call_id for t in every] == [call.pk for call in calls]
    known = {every[0].id, every[2].id}
    assert timers_due_before(until=until, known=known) == [every[1], every[3]]


def _due_soon(scheduler: NearTermScheduler, seconds: float, timer_id: int = -1) -> None:
    """A timer on the heap (not in the table: a negative id, below the feed's high-water mark)
    falling due in `seconds`."""
    due_at = datetime.now(UTC) + timedelta(seconds=seconds)
    scheduler._push([DueTimer(timer_id, "acme", uuid.uuid4(), due_at, "c")])


def test_a_feed_waits_while_a_timer_falls_due_but_never_longer_than_a_poll(world, monkeypatch):
    """Reading the table while a timer falls due would make it late: a feed that is due waits
    until that timer has fired (CLEARANCE), but never longer than one poll interval. (Both
    widened here, so that a slow machine cannot let the timer fall due, or the poll interval
    pass, between two lines of the test.)"""
    monkeypatch.setattr(scheduler_module, "CLEARANCE", 0.3)
    fired = []
    scheduler = NearTermScheduler(fired.extend, poll_interval=5.0, horizon=60)
    scheduler.step()  # the first feed
    call = make_call(due_in=30)  # registered since: the next feed reads it

    _due_soon(scheduler, 0.2)
    scheduler._next_poll = time.monotonic()  # the feed is due
    with recorded_queries() as queries:
        pause = scheduler.step()
    assert not selects_from(queries, "timer_schedules")  # it waits for the timer
    assert pause <= 0.3

    while not fired:
        time.sleep(0.01)
        scheduler.step()
    assert [t.id for t in fired] == [-1]
    with recorded_queries() as queries:
        scheduler.step()  # no timer falls due soon: the feed runs
    assert selects_from(queries, "timer_schedules")
    assert [timer.service_call_id for _, _, timer in scheduler._heap] == [call.pk]

    # A timer falling due at every look cannot hold the feed back longer than a poll interval.
    scheduler._next_poll = time.monotonic() - scheduler.poll_interval
    _due_soon(scheduler, 0.2, timer_id=-2)
    with recorded_queries() as queries:
        scheduler.step()
    assert selects_from(queries, "timer_schedules")


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the skipped reads are SQLite's")
@pytest.mark.django_db(transaction=True)
def test_the_incremental_feed_reads_only_after_a_commit_and_sees_every_new_timer(world):
    """While nothing has been committed since a feed found nothing, the next is skipped
    (core.db.ChangeWatch); a timer registered meanwhile by another connection is read."""
    scheduler = NearTermScheduler(lambda batch: None, poll_interval=0.01, horizon=60, full_refresh=30)

    def feed() -> int:
        scheduler._next_poll = 0.0
        with recorded_queries() as queries:
            scheduler.step()
        return len(selects_from(queries, "timer_schedules"))

    assert feed() >= 1  # the first, full refresh
    assert feed() == 1  # the incremental feed: nothing new
    assert feed() == 0  # nothing committed since: skipped

    registered = []

    def register() -> None:
        try:
            registered.append(make_call(due_in=30))
        finally:
            connection.close()

    thread = threading.Thread(target=register)
    thread.start()
    thread.join(10)
    assert feed() == 1
    assert [timer.service_call_id for _, _, timer in scheduler._heap] == [registered[0].pk]
