"""The real engine (timer, execution, schedules loop) in this process, started after the
workers were stopped over several occurrences: exactly one of them runs, once, the others are
counted as skipped, and the next occurrence is made ahead (docs/schedules.md)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from orchestration.models import ServiceCall
from schedules.cron import next_occurrences
from schedules.models import Schedule
from tests.support.schedules import calls_of, make_schedule
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stopped_over_five_runs(world, http_target):
    """An hourly schedule made when the workers stopped, five hours ago. Its minute is half an
    hour from now, so no new occurrence comes due while the test runs."""
    now = datetime.now(UTC)
    minute = (now.minute + 30) % 60
    schedule = make_schedule(
        name="catch-up",
        cron=f"{minute} * * * *",
        timezone="UTC",
        url=http_target.url("/ok?catch-up"),
        now=now - timedelta(hours=5),
    )
    missed = next_occurrences(schedule.cron, "UTC", after=now - timedelta(hours=5), count=10, end_at=now)
    assert len(missed) == 5
    return schedule, missed


def test_on_start_one_missed_occurrence_runs_and_the_rest_are_counted(stopped_over_five_runs, http_target, engine):
    schedule, missed = stopped_over_five_runs

    def settled():
        fresh = Schedule.objects.get(pk=schedule.pk)
        return fresh if fresh.last_occurrence_at > datetime.now(UTC) else None

    fresh = wait_for(settled, timeout=20)
    wait_for(lambda: http_target.count("/ok") == 1, timeout=20)
    time.sleep(1.5)  # nothing else runs
    assert http_target.count("/ok") == 1

    assert fresh.skipped_count == 4
    calls = calls_of(schedule)
    ran = [call for call in calls if call.started_at is not None]
    assert len(ran) == 1 and ran[0].occurrence_at in (missed[0], missed[-1])
    ahead = [call for call in calls if call.occurrence_at > datetime.now(UTC)]
    assert [call.status for call in ahead] == [ServiceCall.Status.SCHEDULED]
    # The oldest one, made ahead before the stop, either ran (the timer got it first) or was
    # cancelled for the latest; no other missed occurrence has a call.
    assert {call.occurrence_at for call in calls} <= {missed[0], missed[-1], ahead[0].occurrence_at}
