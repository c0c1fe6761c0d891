"""Workers stopped over several occurrences (docs/schedules.md, "Missed occurrences"): when
the loop runs again, one of the missed occurrences runs, once, and the others are skipped and
counted: no catch-up storm. The clock is injected into the service."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestration.models import ServiceCall
from orchestration.services import service_call_start
from schedules.services import GRACE, schedules_materialize
from tests.support.schedules import calls_of, make_schedule

pytestmark = pytest.mark.django_db

# In the past: the calls made for these occurrences are due at once (as after a real outage),
# so the timer's start can be played here with service_call_start.
T0 = datetime(2026, 1, 5, 9, 20, tzinfo=UTC)
X0 = datetime(2026, 1, 5, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)


def statuses(schedule) -> dict[datetime, str]:
    return {call.occurrence_at: call.status for call in calls_of(schedule)}


def test_the_latest_missed_occurrence_runs_once_and_the_older_ones_are_counted(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)
    # The workers stop before X0 and come back at 14:10: X0 (made ahead, still waiting), 11:00,
    # 12:00, 13:00 and 14:00 were all missed.
    back = X0 + 4 * HOUR + timedelta(minutes=10)

    assert schedules_materialize(now=back).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {
        X0: ServiceCall.Status.CANCELLED,  # the call made ahead for the oldest: skipped
        X0 + 4 * HOUR: ServiceCall.Status.SCHEDULED,  # the latest missed one: runs now
        X0 + 5 * HOUR: ServiceCall.Status.SCHEDULED,  # the next one, made ahead as usual
    }
    assert schedule.skipped_count == 4
    latest = next(c for c in calls_of(schedule) if c.occurrence_at == X0 + 4 * HOUR)
    assert latest.due_at <= datetime.now(UTC)  # due at once
    assert schedule.last_occurrence_at == schedule.advance_at == X0 + 5 * HOUR
    # Nothing more to catch up: the next pass only waits for 15:00.
    assert schedules_materialize(now=back + timedelta(seconds=1)).advanced == 0


def test_when_the_timer_starts_the_call_made_ahead_first_that_is_the_one_run(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)
    x0_call = calls_of(schedule)[0]
    # On start the timer fires the overdue call before the loop looks at the schedule.
    assert service_call_start(tenant_id="acme", service_call_id=x0_call.pk) is not None

    assert schedules_materialize(now=X0 + 3 * HOUR + timedelta(minutes=5)).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {X0: ServiceCall.Status.RUNNING, X0 + 4 * HOUR: ServiceCall.Status.SCHEDULED}
    assert schedule.skipped_count == 3  # 11:00, 12:00 and 13:00


def test_a_call_made_ahead_less_than_the_grace_late_is_not_missed(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)

    # The loop comes by 50 s after 10:00: the call for 10:00 is about to be started by the timer.
    assert schedules_materialize(now=X0 + GRACE - timedelta(seconds=10)).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {X0: ServiceCall.Status.SCHEDULED, X0 + HOUR: ServiceCall.Status.SCHEDULED}
    assert schedule.skipped_count == 0


def test_an_occurrence_that_ran_on_time_before_the_stop_is_not_the_catch_up(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)
    x0_call = calls_of(schedule)[0]
    assert service_call_start(tenant_id="acme", service_call_id=x0_call.pk) is not None
    # It started on time (the timer's heap had it), and the workers stopped right after, before
    # the loop made the next call: 11:00 and 12:00 are missed, and 12:00 runs.
    ServiceCall.objects.filter(pk=x0_call.pk).update(started_at=X0 + timedelta(milliseconds=5))

    assert schedules_materialize(now=X0 + 2 * HOUR + timedelta(minutes=1, seconds=30)).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {
        X0: ServiceCall.Status.RUNNING,
        X0 + 2 * HOUR: ServiceCall.Status.SCHEDULED,
        X0 + 3 * HOUR: ServiceCall.Status.SCHEDULED,
    }
    assert schedule.skipped_count == 1  # 11:00


def test_a_minutely_schedule_stopped_for_a_day_runs_once_and_counts_the_rest(world):
    schedule = make_schedule(cron="* * * * *", timezone="UTC", now=T0)
    first = calls_of(schedule)[0].occurrence_at

    assert schedules_materialize(now=first + timedelta(days=1, seconds=20)).advanced == 1

    schedule.refresh_from_db()
    made = statuses(schedule)
    assert list(made.values()).count(ServiceCall.Status.SCHEDULED) == 2  # the latest missed, and the next
    assert schedule.skipped_count == 24 * 60  # 1441 missed minutes, one of which runs
    assert first + timedelta(days=1) in made and first + timedelta(days=1, minutes=1) in made


def test_a_schedule_ended_during_the_stop_runs_its_latest_missed_occurrence_and_ends(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", end_at=X0 + 2 * HOUR, now=T0)

    assert schedules_materialize(now=X0 + 6 * HOUR).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {X0: ServiceCall.Status.CANCELLED, X0 + 2 * HOUR: ServiceCall.Status.SCHEDULED}
    assert schedule.skipped_count == 2  # 10:00 and 11:00
    assert schedule.advance_at is None
