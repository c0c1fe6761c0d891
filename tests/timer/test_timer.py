"""Durable timers: idempotent registration, never re-armed once reached, indexed due query."""

from datetime import UTC, datetime, timedelta

from django.db import connection

from orchestration.services import service_call_submit
from orchestration.validation import validate_submission
from timer.models import TimerSchedule
from timer.scheduler import NearTermScheduler
from timer.selectors import timers_due_before
from timer.services import timer_register, timers_mark_reached


def make_call(due_in: float = 60):
    data = {
        "name": "t",
        "requestSpec": {"method": "GET", "url": "https://example.test/"},
        "dueAt": (datetime.now(UTC) + timedelta(seconds=due_in)).isoformat(),
    }
    call, _ = service_call_submit(tenant_id="acme", submission=validate_submission(data), correlation_id="c")
    return call


def test_registering_twice_keeps_one_timer_and_moves_its_due_time(world):
    call = make_call()
    later = datetime.now(UTC) + timedelta(hours=1)
    assert timer_register(tenant_id="acme", service_call_id=call.pk, due_at=later, correlation_id="c")
    assert TimerSchedule.objects.filter(service_call=call).count() == 1
    assert TimerSchedule.objects.get(service_call=call).due_at == later


def test_a_reached_timer_is_never_re_armed(world):
    call = make_call()
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
            import time

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
    # One batch try plus one single try, then the timer waits (backoff), not 20 tries.
    assert len(calls) <= 3
    assert TimerSchedule.objects.get().state == TimerSchedule.State.SCHEDULED


def test_the_due_query_uses_the_partial_pending_index(world):
    make_call()
    qs = TimerSchedule.objects.filter(state=TimerSchedule.State.SCHEDULED, due_at__lte=datetime.now(UTC)).order_by(
        "due_at"
    )
    sql, params = qs.values_list("id", "tenant_id", "service_call_id", "due_at", "correlation_id")[
        :1000
    ].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = " | ".join(row[-1] for row in cursor.fetchall())
    assert "USING INDEX timer_schedules_pending" in plan, plan
    assert "TEMP B-TREE" not in plan, plan
    assert len(timers_due_before(until=datetime.now(UTC) + timedelta(days=1))) == 1
