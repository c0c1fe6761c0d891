"""A schedule's jitter (docs/schedules.md, "Jitter"): each occurrence's call is due later by an
offset of its own within the window, spread over it, the same wherever it is computed (the loop,
the API's nextRuns, the page); bad values are a 400 naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from schedules.cron import jitter_of
from schedules.materialize import schedules_materialize
from schedules.models import Schedule
from tests.support.api import ApiClient
from tests.support.schedules import calls_of, make_schedule, schedule_payload

# Ahead of the clock: a call's due time in the past would be moved to now at its submission.
T0 = (datetime.now(UTC) + timedelta(days=1)).replace(minute=20, second=0, microsecond=0)
WINDOW_MS = 600_000


def test_each_occurrences_call_is_due_by_its_own_offset_spread_over_the_window(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)
    Schedule.objects.filter(pk=schedule.pk).update(jitter_ms=WINDOW_MS)
    schedule.refresh_from_db()
    # Forty-eight hours of occurrences, each made by the loop as the one before comes due.
    for hour in range(48):
        schedules_materialize(now=T0 + timedelta(hours=hour, minutes=40, seconds=30))
    made = [call for call in calls_of(schedule) if call.occurrence_at > T0 + timedelta(hours=1)]
    assert len(made) >= 40
    offsets = [(call.due_at - call.occurrence_at).total_seconds() for call in made]
    assert all(0 <= offset < WINDOW_MS / 1000 for offset in offsets)
    assert min(offsets) < 0.15 * WINDOW_MS / 1000 and max(offsets) > 0.85 * WINDOW_MS / 1000  # spread
    # Each hour its own offset; two of 48 drawn from 600,000 milliseconds meet once in 500 runs.
    assert len(set(offsets)) >= len(offsets) - 2
    for call in made:  # the same rule wherever it is computed
        assert call.due_at == call.occurrence_at + jitter_of(schedule.pk, call.occurrence_at, WINDOW_MS)


def test_the_api_shows_each_runs_due_time_and_a_change_replans_the_call_made_ahead(world):
    api = ApiClient(world.acme_key)
    made = api.post(
        "/api/tenants/acme/schedules", schedule_payload(cron="0 * * * *", timezone="UTC", jitterMs=WINDOW_MS)
    )
    assert made.status_code == 201, made.json()
    body = made.json()
    assert body["jitterMs"] == WINDOW_MS
    [ahead] = body["recentCalls"]
    first = body["nextRuns"][0]
    assert first["dueAt"] == ahead["dueAt"]
    assert all("dueAt" in run for run in body["nextRuns"])
    # Without jitter, no dueAt: the call is due at the occurrence.
    changed = api.patch(f"/api/tenants/acme/schedules/{body['scheduleId']}", {"jitterMs": 0}).json()
    assert all("dueAt" not in run for run in changed["nextRuns"])
    [ahead] = [call for call in changed["recentCalls"] if call["status"] == "Scheduled"]  # the old one cancelled
    assert ahead["dueAt"] == changed["nextRuns"][0]["at"]


@pytest.mark.parametrize("value", [-1, 3_600_001, 1.5, "60000", True, None])
def test_a_bad_jitter_is_a_400_naming_the_field(world, value):
    answer = ApiClient(world.acme_key).post("/api/tenants/acme/schedules", schedule_payload(jitterMs=value))
    assert answer.status_code == 400 and "jitterMs" in answer.json()["errors"]
    assert not Schedule.objects.exists()


def test_the_documented_example(world):
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "schedules.md").read_text().split())
    assert 'With `"jitterMs": 600000` an hourly schedule\'s calls are due somewhere in the first ten minutes' in text
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=T0)
    offsets = {jitter_of(schedule.pk, T0.replace(minute=0) + timedelta(hours=h), 600_000) for h in range(24)}
    assert all(timedelta(0) <= offset < timedelta(minutes=10) for offset in offsets) and len(offsets) == 24


def test_a_call_due_later_by_its_jitter_is_not_missed_by_a_late_loop(world):
    # A schedule whose first occurrence's call is due at least three minutes late (the offset
    # depends on the schedule's id: a few are made until one has it).
    for n in range(20):
        schedule = make_schedule(name=f"late {n}", cron="0 * * * *", timezone="UTC", now=T0)
        x0 = schedule.advance_at
        if jitter_of(schedule.pk, x0, 3_000_000) >= timedelta(minutes=3):
            break
    else:
        raise AssertionError("no offset of three minutes in twenty schedules")
    Schedule.objects.filter(pk=schedule.pk).update(jitter_ms=3_000_000)  # 50 minutes
    # The loop comes by two minutes late: the call made ahead is due later still, so not missed.
    schedules_materialize(now=x0 + timedelta(minutes=2))
    [ahead] = [c for c in calls_of(schedule) if c.occurrence_at == x0]
    assert ahead.status == "Scheduled"
    schedule.refresh_from_db()
    assert schedule.skipped_count == 0
