"""schedules_materialize, the loop's pass, with the clock injected: each occurrence becomes
one call made ahead (the next one is made as the one before comes due), in the schedule's own
zone across DST days, inside its start and end (docs/schedules.md)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from orchestration.models import ServiceCall
from schedules.materialize import schedules_materialize
from schedules.models import Schedule
from tests.support.schedules import calls_of, make_schedule, occurrences_made

pytestmark = pytest.mark.django_db


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def run_loop_until(schedule: Schedule, until: datetime) -> None:
    """Wake the loop the moment each call made ahead comes due, as the engine's loop does
    (within its second), until `until`. Nothing runs the calls here (no timer): at every step
    exactly one call is made for the time ahead, and it is the one coming due."""
    while True:
        schedule.refresh_from_db()
        if schedule.advance_at is None or schedule.advance_at > until:
            return
        ahead = [c for c in calls_of(schedule) if c.occurrence_at >= schedule.advance_at]
        assert [(c.occurrence_at, c.status) for c in ahead] == [(schedule.advance_at, ServiceCall.Status.SCHEDULED)]
        assert schedules_materialize(now=schedule.advance_at + timedelta(milliseconds=400)).advanced == 1


def local_days(schedule: Schedule) -> Counter:
    zone = ZoneInfo(schedule.timezone)
    return Counter(at.astimezone(zone).date().isoformat() for at in occurrences_made(schedule))


@pytest.mark.parametrize(
    ("zone", "created", "until", "jump_day", "jump_run"),
    [
        ("Europe/Berlin", utc(2027, 3, 26, 12), utc(2027, 3, 31, 12), "2027-03-28", utc(2027, 3, 28, 1)),
        ("America/New_York", utc(2027, 3, 12, 12), utc(2027, 3, 17, 12), "2027-03-14", utc(2027, 3, 14, 7)),
    ],
)
def test_spring_forward_the_skipped_half_past_two_runs_once_right_after_the_jump(
    world, zone, created, until, jump_day, jump_run
):
    schedule = make_schedule(cron="30 2 * * *", timezone=zone, now=created)

    run_loop_until(schedule, until)

    days = local_days(schedule)
    assert set(days.values()) == {1}, days  # one run on every day, the jump's day included
    assert jump_day in days
    assert jump_run in occurrences_made(schedule)
    [call] = [c for c in calls_of(schedule) if c.occurrence_at == jump_run]
    assert call.occurrence_at.astimezone(ZoneInfo(zone)).strftime("%H:%M") == "03:00"
    assert call.due_at == jump_run  # dueAt is the occurrence: the timer fires it then


@pytest.mark.parametrize(
    ("zone", "created", "until", "back_day", "back_run"),
    [
        # Berlin repeats 02:00-02:59 on 2027-10-31: 02:30 runs on its first pass only.
        ("Europe/Berlin", utc(2027, 10, 29, 12), utc(2027, 11, 2, 12), "2027-10-31", utc(2027, 10, 31, 0, 30)),
        # New York repeats 01:00-01:59 on 2027-11-07: 02:30 happens once.
        ("America/New_York", utc(2027, 11, 5, 12), utc(2027, 11, 9, 12), "2027-11-07", utc(2027, 11, 7, 7, 30)),
    ],
)
def test_fall_back_the_half_past_two_runs_once(world, zone, created, until, back_day, back_run):
    schedule = make_schedule(cron="30 2 * * *", timezone=zone, now=created)

    run_loop_until(schedule, until)

    days = local_days(schedule)
    assert set(days.values()) == {1}, days
    assert back_run in occurrences_made(schedule)
    assert days[back_day] == 1


def test_new_york_repeated_hour_runs_once_on_its_first_pass(world):
    schedule = make_schedule(cron="30 1 * * *", timezone="America/New_York", now=utc(2027, 11, 5, 12))

    run_loop_until(schedule, utc(2027, 11, 9))

    made = occurrences_made(schedule)
    assert utc(2027, 11, 7, 5, 30) in made  # 01:30 EDT
    assert utc(2027, 11, 7, 6, 30) not in made  # 01:30 EST, the repeat
    assert set(local_days(schedule).values()) == {1}


def test_a_utc_schedule_keeps_its_hour_through_every_dst_change(world):
    schedule = make_schedule(cron="30 2 * * *", timezone="UTC", now=utc(2027, 3, 10))

    run_loop_until(schedule, utc(2027, 3, 31))

    made = occurrences_made(schedule)
    assert len(made) == 22
    assert {(at.hour, at.minute) for at in made} == {(2, 30)}


def test_the_first_call_is_made_at_creation_and_each_next_one_as_the_previous_comes_due(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=utc(2027, 5, 1, 9, 20))

    assert occurrences_made(schedule) == [utc(2027, 5, 1, 10)]
    assert schedules_materialize(now=utc(2027, 5, 1, 9, 59, 59)).advanced == 0  # not due yet
    assert occurrences_made(schedule) == [utc(2027, 5, 1, 10)]
    assert schedules_materialize(now=utc(2027, 5, 1, 10, 0, 0, 300_000)).advanced == 1
    assert occurrences_made(schedule) == [utc(2027, 5, 1, 10), utc(2027, 5, 1, 11)]
    assert schedules_materialize(now=utc(2027, 5, 1, 10, 0, 1)).advanced == 0  # already done
    schedule.refresh_from_db()
    assert schedule.skipped_count == 0 and schedule.last_occurrence_at == utc(2027, 5, 1, 11)


def test_no_occurrence_before_start_or_after_end(world):
    schedule = make_schedule(
        cron="0 12 * * *",
        timezone="Europe/Berlin",
        start_at=utc(2027, 6, 3, 9),
        end_at=utc(2027, 6, 6, 10),
        now=utc(2027, 6, 1),
    )

    run_loop_until(schedule, utc(2027, 7, 1))

    assert occurrences_made(schedule) == [
        utc(2027, 6, 3, 10),
        utc(2027, 6, 4, 10),
        utc(2027, 6, 5, 10),
        utc(2027, 6, 6, 10),
    ]
    schedule.refresh_from_db()
    assert schedule.advance_at is None  # ended: the loop looks at it no more
    assert schedules_materialize(now=utc(2027, 8, 1)).advanced == 0


def test_a_paused_schedule_is_not_advanced(world):
    schedule = make_schedule(cron="* * * * *", timezone="UTC", paused=True, now=utc(2027, 5, 1))

    assert schedules_materialize(now=utc(2027, 5, 2)).advanced == 0
    assert calls_of(schedule) == []


def test_a_loop_working_from_a_stale_read_changes_nothing(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=utc(2027, 5, 1, 9, 20))
    stale = Schedule.objects.get(pk=schedule.pk)
    assert schedules_materialize(now=utc(2027, 5, 1, 10, 0, 1)).advanced == 1

    from schedules.materialize import Missed, _round

    assert _round(stale, now=utc(2027, 5, 1, 10, 0, 1), missed=Missed()) == 0
    assert occurrences_made(schedule) == [utc(2027, 5, 1, 10), utc(2027, 5, 1, 11)]


def test_one_pass_handles_at_most_its_batch(world):
    for n in range(3):
        make_schedule(name=f"s{n}", cron="0 * * * *", timezone="UTC", now=utc(2027, 5, 1, 9, 20))

    first = schedules_materialize(now=utc(2027, 5, 1, 10, 0, 1), limit=2)
    second = schedules_materialize(now=utc(2027, 5, 1, 10, 0, 1), limit=2)

    assert (first.advanced, second.advanced) == (2, 1)
    assert ServiceCall.objects.count() == 6
