"""The real engine (timer, execution, schedules loop) in this process, started after the
workers were stopped over several occurrences: those within the catch-up window run, once each,
oldest first; the others are skipped, counted and raised as events; the next occurrence is made
ahead (docs/schedules.md)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from core.ids import iso_ms
from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
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
    # The latest two missed occurrences fall within the window: 1.5 and 0.5 hours ago. They fall
    # due together: allowAll runs both whatever the other does (overlap: tests/schedules/test_overlap*).
    Schedule.objects.filter(pk=schedule.pk).update(catchup_window_s=2 * 3600, overlap="allowAll")
    ServiceCall.objects.filter(schedule_id=schedule.pk).update(overlap="allowAll")
    return schedule, missed


def test_on_start_the_missed_occurrences_within_the_window_run_and_the_rest_are_skipped(
    stopped_over_five_runs, http_target, engine
):
    schedule, missed = stopped_over_five_runs

    def settled():
        fresh = Schedule.objects.get(pk=schedule.pk)
        return fresh if fresh.last_occurrence_at > datetime.now(UTC) else None

    fresh = wait_for(settled, timeout=20)
    # The window (set before the engine started) holds the latest two missed occurrences; the
    # oldest one's call, made ahead before the stop, either ran (the timer got it first as the
    # engine started) or was cancelled and skipped.
    wait_for(lambda: http_target.count("/ok") >= 2, timeout=20)
    time.sleep(1.5)  # nothing else runs
    calls = calls_of(schedule)
    ran = sorted((call for call in calls if call.started_at is not None), key=lambda call: call.started_at)
    assert [call.occurrence_at for call in ran] in (missed[-2:], [missed[0], *missed[-2:]])
    assert http_target.count("/ok") == len(ran)

    fresh.refresh_from_db()
    assert fresh.skipped_count == 5 - len(ran) and fresh.skipped_reasons == {"catchupWindow": 5 - len(ran)}
    ahead = [call for call in calls if call.occurrence_at > datetime.now(UTC)]
    assert [call.status for call in ahead] == [ServiceCall.Status.SCHEDULED]
    skipped = OutboxEvent.objects.filter(aggregate_id=schedule.pk, event_type="ScheduleOccurrenceSkipped")
    shown = sorted(row.event_payload["payload"]["occurrenceAt"] for row in skipped)
    assert shown == [iso_ms(at) for at in missed[:3] if at not in {call.occurrence_at for call in ran}]
