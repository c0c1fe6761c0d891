"""Workers stopped over several occurrences (docs/schedules.md, "Missed occurrences"): when the
loop runs again, the missed occurrences within the schedule's catch-up window (1 minute unless
set) run once each, oldest first; older ones are skipped, each counted by reason and raised as a
ScheduleOccurrenceSkipped event. The clock is injected into the service."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.ids import iso_ms
from orchestration.models import ServiceCall
from orchestration.services import service_call_start
from outbox.models import OutboxEvent
from schedules.materialize import CATCHUP_MAX, SKIPPED_EVENTS_MAX, schedules_materialize
from schedules.models import Schedule
from tests.support.schedules import calls_of, make_schedule

pytestmark = pytest.mark.django_db

# In the past: the calls made for these occurrences are due at once (as after a real outage),
# so the timer's start can be played here with service_call_start.
T0 = datetime(2026, 1, 5, 9, 20, tzinfo=UTC)
X0 = datetime(2026, 1, 5, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)
BACK = X0 + 4 * HOUR + timedelta(minutes=10)  # the workers stop before 10:00 and come back at 14:10


def statuses(schedule) -> dict[datetime, str]:
    return {call.occurrence_at: call.status for call in calls_of(schedule)}


def skipped_events(schedule) -> list[dict]:
    rows = OutboxEvent.objects.filter(aggregate_id=schedule.pk, event_type="ScheduleOccurrenceSkipped").order_by("id")
    return [row.event_payload["payload"] for row in rows]


def window(schedule, text: str) -> None:
    Schedule.objects.filter(pk=schedule.pk).update(catchup_window_s={"2h": 7200, "6h": 21600, "1d": 86400}[text])


def test_by_default_occurrences_missed_more_than_a_minute_ago_are_skipped_each_with_its_event(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)

    assert schedules_materialize(now=BACK).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {
        X0: ServiceCall.Status.CANCELLED,  # the call made ahead, missed: skipped
        X0 + 5 * HOUR: ServiceCall.Status.SCHEDULED,  # the next one, made ahead as usual
    }
    assert schedule.skipped_count == 5 and schedule.skipped_reasons == {"catchupWindow": 5}
    assert skipped_events(schedule) == [
        {"scheduleId": str(schedule.pk), "occurrenceAt": iso_ms(X0 + n * HOUR), "reason": "catchupWindow"}
        for n in range(5)
    ]
    assert schedule.last_occurrence_at == schedule.advance_at == X0 + 5 * HOUR
    # Nothing more to catch up: the next pass only waits for 15:00.
    assert schedules_materialize(now=BACK + timedelta(seconds=1)).advanced == 0


def test_occurrences_within_the_catch_up_window_run_once_each_oldest_first(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)
    window(schedule, "2h")  # from 12:10: 12:00 and older are skipped, 13:00 and 14:00 run

    assert schedules_materialize(now=BACK).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {
        X0: ServiceCall.Status.CANCELLED,
        X0 + 3 * HOUR: ServiceCall.Status.SCHEDULED,
        X0 + 4 * HOUR: ServiceCall.Status.SCHEDULED,
        X0 + 5 * HOUR: ServiceCall.Status.SCHEDULED,
    }
    runs = sorted((c for c in calls_of(schedule) if c.occurrence_at < BACK), key=lambda c: c.due_at)
    assert [c.occurrence_at for c in runs if c.status == "Scheduled"] == [X0 + 3 * HOUR, X0 + 4 * HOUR]
    assert [e["occurrenceAt"] for e in skipped_events(schedule)] == [iso_ms(X0 + n * HOUR) for n in range(3)]
    assert schedule.skipped_count == 3

    # A window that holds every missed occurrence: the call made ahead is kept, the rest made.
    other = make_schedule(name="wide", cron="0 * * * *", timezone="UTC", now=T0)
    window(other, "6h")
    schedules_materialize(now=BACK)
    other.refresh_from_db()
    assert set(statuses(other).values()) == {ServiceCall.Status.SCHEDULED} and len(statuses(other)) == 6
    assert other.skipped_count == 0 and skipped_events(other) == []


def test_when_the_timer_starts_the_call_made_ahead_first_it_runs_and_is_not_skipped(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)
    x0_call = calls_of(schedule)[0]
    # On start the timer fires the overdue call before the loop looks at the schedule.
    assert service_call_start(tenant_id="acme", service_call_id=x0_call.pk) is not None

    assert schedules_materialize(now=X0 + 3 * HOUR + timedelta(minutes=5)).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {X0: ServiceCall.Status.RUNNING, X0 + 4 * HOUR: ServiceCall.Status.SCHEDULED}
    assert schedule.skipped_count == 3  # 11:00, 12:00 and 13:00


def test_a_call_made_ahead_less_than_the_window_late_is_not_missed(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)

    # The loop comes by 50 s after 10:00: the call for 10:00 is about to be started by the timer.
    assert schedules_materialize(now=X0 + timedelta(seconds=50)).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {X0: ServiceCall.Status.SCHEDULED, X0 + HOUR: ServiceCall.Status.SCHEDULED}
    assert schedule.skipped_count == 0


def test_a_minutely_schedule_stopped_for_a_day_runs_at_most_the_latest_thousand_and_counts_the_rest(world):
    schedule = make_schedule(cron="* * * * *", timezone="UTC", now=T0)
    first = calls_of(schedule)[0].occurrence_at
    window(schedule, "1d")

    assert schedules_materialize(now=first + timedelta(days=1, seconds=20)).advanced == 1

    schedule.refresh_from_db()
    made = statuses(schedule)
    assert list(made.values()).count(ServiceCall.Status.SCHEDULED) == CATCHUP_MAX + 1  # and the next
    assert schedule.skipped_count == 24 * 60 + 1 - CATCHUP_MAX  # 1441 missed minutes
    assert len(skipped_events(schedule)) == min(schedule.skipped_count, SKIPPED_EVENTS_MAX)


def test_a_schedule_ended_during_the_stop_skips_what_it_missed_and_ends(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", end_at=X0 + 2 * HOUR, now=T0)

    assert schedules_materialize(now=X0 + 6 * HOUR).advanced == 1

    schedule.refresh_from_db()
    assert statuses(schedule) == {X0: ServiceCall.Status.CANCELLED}
    assert schedule.skipped_count == 3  # 10:00, 11:00 and 12:00
    assert schedule.advance_at is None
