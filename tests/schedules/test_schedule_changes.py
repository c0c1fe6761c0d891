"""schedule_update, schedule_set_paused and schedule_delete (docs/schedules.md, "Pause,
changes and delete"): what happens to the call made ahead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.errors import NotFound, ValidationFailed
from orchestration.models import ServiceCall
from orchestration.services import service_call_start
from schedules.materialize import schedules_materialize
from schedules.models import Schedule
from schedules.services import schedule_delete, schedule_set_paused, schedule_update
from schedules.validation import validate_schedule
from tests.support.schedules import calls_of, make_schedule

pytestmark = pytest.mark.django_db

T0 = datetime(2027, 5, 1, 9, 20, tzinfo=UTC)
HOUR = timedelta(hours=1)


def statuses(schedule) -> list[tuple[datetime, str]]:
    return [(call.occurrence_at, call.status) for call in calls_of(schedule)]


def change(schedule, data: dict, *, now: datetime) -> Schedule:
    return schedule_update(
        tenant_id=schedule.tenant_id,
        schedule_id=schedule.schedule_id,
        data=validate_schedule(data, partial=True, now=now),
        now=now,
    )


def test_pausing_cancels_the_call_made_ahead_and_makes_nothing_more(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)

    paused = schedule_set_paused(tenant_id="acme", schedule_id=schedule.pk, paused=True, now=T0 + HOUR / 4)

    assert paused.paused and paused.advance_at is None
    assert statuses(schedule) == [(T0 + HOUR * 2 / 3, ServiceCall.Status.CANCELLED)]
    assert schedules_materialize(now=T0 + 10 * HOUR).advanced == 0
    assert len(calls_of(schedule)) == 1


def test_resuming_plans_from_now_and_counts_nothing_skipped(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)
    schedule_set_paused(tenant_id="acme", schedule_id=schedule.pk, paused=True, now=T0)

    resumed = schedule_set_paused(tenant_id="acme", schedule_id=schedule.pk, paused=False, now=T0 + 5 * HOUR)

    assert statuses(schedule)[-1] == (datetime(2027, 5, 1, 15, tzinfo=UTC), ServiceCall.Status.SCHEDULED)
    assert resumed.skipped_count == 0 and resumed.advance_at == datetime(2027, 5, 1, 15, tzinfo=UTC)


def test_pausing_leaves_a_call_that_already_started_to_run(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=datetime(2026, 1, 5, 9, 20, tzinfo=UTC))
    [call] = calls_of(schedule)
    assert service_call_start(tenant_id="acme", service_call_id=call.pk) is not None

    schedule_set_paused(tenant_id="acme", schedule_id=schedule.pk, paused=True)

    assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.RUNNING


def test_a_new_request_applies_to_the_next_call(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)

    change(schedule, {"requestSpec": {"method": "PUT", "url": "http://127.0.0.1:9/v2"}, "tags": ["v2"]}, now=T0)

    waiting = [c for c in calls_of(schedule) if c.status == ServiceCall.Status.SCHEDULED]
    assert [c.request_spec["url"] for c in waiting] == ["http://127.0.0.1:9/v2"]
    assert [c.request_spec["method"] for c in waiting] == ["PUT"]
    assert all(c.request_spec["url"] != "http://127.0.0.1:9/v2" for c in calls_of(schedule) if c not in waiting)
    schedule.refresh_from_db()
    assert schedule.tags == ["v2"]


def test_a_new_request_before_the_next_run_still_runs_that_occurrence(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)

    change(schedule, {"requestSpec": {"method": "PUT", "url": "http://127.0.0.1:9/v2"}}, now=T0)

    schedule.refresh_from_db()
    assert schedule.advance_at == T0 + HOUR * 2 / 3  # 10:00, with the new request


def test_pausing_and_resuming_before_the_next_run_still_runs_it(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)
    schedule_set_paused(tenant_id="acme", schedule_id=schedule.pk, paused=True, now=T0)

    resumed = schedule_set_paused(
        tenant_id="acme", schedule_id=schedule.pk, paused=False, now=T0 + timedelta(minutes=5)
    )

    assert resumed.advance_at == T0 + HOUR * 2 / 3  # 10:00 again


def test_a_new_zone_moves_the_next_run(world):
    schedule = make_schedule(cron="30 2 * * *", timezone="UTC", now=T0)

    changed = change(schedule, {"timezone": "Asia/Kolkata"}, now=T0)

    assert statuses(schedule) == [
        (datetime(2027, 5, 1, 21, tzinfo=UTC), ServiceCall.Status.SCHEDULED),  # 02:30 IST
        (datetime(2027, 5, 2, 2, 30, tzinfo=UTC), ServiceCall.Status.CANCELLED),
    ]
    assert changed.last_occurrence_at == changed.advance_at == datetime(2027, 5, 1, 21, tzinfo=UTC)


def test_a_new_end_keeps_the_call_made_ahead_and_stops_after_the_last_run(world):
    schedule = make_schedule(cron="0 0 * * *", timezone="UTC", now=T0)

    change(schedule, {"endAt": "2027-05-03T12:00:00Z"}, now=T0)
    for day in (2, 3):
        schedules_materialize(now=datetime(2027, 5, day, 0, 0, 1, tzinfo=UTC))

    assert statuses(schedule) == [
        (datetime(2027, 5, 2, tzinfo=UTC), ServiceCall.Status.SCHEDULED),
        (datetime(2027, 5, 3, tzinfo=UTC), ServiceCall.Status.SCHEDULED),
    ]
    schedule.refresh_from_db()
    assert schedule.advance_at is None


def test_an_end_that_leaves_no_run_is_refused_pause_or_delete_stops_it(world):
    schedule = make_schedule(cron="0 0 * * *", timezone="UTC", now=T0)

    with pytest.raises(ValidationFailed) as refused:
        change(schedule, {"endAt": "2027-05-01T23:00:00Z"}, now=T0)

    assert "No occurrence" in refused.value.errors["endAt"][0]
    assert statuses(schedule) == [(datetime(2027, 5, 2, tzinfo=UTC), ServiceCall.Status.SCHEDULED)]


def test_a_name_change_keeps_the_call_made_ahead(world):
    schedule = make_schedule(cron="0 0 * * *", timezone="UTC", now=T0)

    change(schedule, {"name": "renamed"}, now=T0)

    assert statuses(schedule) == [(datetime(2027, 5, 2, tzinfo=UTC), ServiceCall.Status.SCHEDULED)]


def test_a_change_is_checked_against_the_whole_schedule(world):
    schedule = make_schedule(cron="0 0 1 1 *", timezone="UTC", now=T0)
    before = list(Schedule.objects.values()), statuses(schedule)

    with pytest.raises(ValidationFailed) as refused:
        change(schedule, {"endAt": "2027-12-01T00:00:00Z"}, now=T0)

    assert "endAt" in refused.value.errors
    assert (list(Schedule.objects.values()), statuses(schedule)) == before


def test_delete_cancels_the_call_made_ahead_and_keeps_the_others(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=datetime(2026, 1, 5, 9, 20, tzinfo=UTC))
    [first] = calls_of(schedule)
    assert service_call_start(tenant_id="acme", service_call_id=first.pk) is not None
    schedules_materialize(now=datetime(2026, 1, 5, 10, 0, 1, tzinfo=UTC))
    [_, ahead] = calls_of(schedule)

    schedule_delete(tenant_id="acme", schedule_id=schedule.pk)

    assert not Schedule.objects.filter(pk=schedule.pk).exists()
    assert ServiceCall.objects.get(pk=first.pk).status == ServiceCall.Status.RUNNING
    assert ServiceCall.objects.get(pk=ahead.pk).status == ServiceCall.Status.CANCELLED


def test_another_tenant_cannot_change_or_delete_it(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)

    with pytest.raises(NotFound):
        schedule_set_paused(tenant_id="globex", schedule_id=schedule.pk, paused=True)
    with pytest.raises(NotFound):
        schedule_delete(tenant_id="globex", schedule_id=schedule.pk)
    schedule.refresh_from_db()
    assert not schedule.paused and statuses(schedule)[0][1] == ServiceCall.Status.SCHEDULED
