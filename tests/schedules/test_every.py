"""Interval schedules (docs/schedules.md, "Intervals"): `every` instead of a cron, anchored at
startAt (or the creation), in real time; refused below a minute, beside a cron, or malformed
(a 400 naming the field); the loop makes its occurrences like a cron's; the pages and
create_schedule take it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.test import Client

from core.ids import iso_ms
from schedules.materialize import schedules_materialize
from schedules.models import Schedule
from tests.commands.cli import call
from tests.support.api import ApiClient
from tests.support.schedules import calls_of, schedule_payload

SCHEDULES = "/api/tenants/acme/schedules"
START = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)


def interval(**extra) -> dict:
    body = schedule_payload(every="15m", startAt=iso_ms(START), **extra)
    del body["cron"]
    return body


def test_the_documented_example_runs_every_fifteen_minutes_from_its_start(world):
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "schedules.md").read_text().split())
    example = 'With `"every": "15m"` and `"startAt": "2026-01-01T00:05:00Z"` the runs fall at 5, 20, 35 and 50 minutes'
    assert example in text
    made = ApiClient(world.acme_key).post(SCHEDULES, interval())
    assert made.status_code == 201, made.json()
    body = made.json()
    assert (body["cron"], body["every"]) == (None, "15m")
    runs = [datetime.fromisoformat(run["at"].replace("Z", "+00:00")) for run in body["nextRuns"]]
    assert {at.minute for at in runs} <= {5, 20, 35, 50} and all(at.second == 0 for at in runs)
    assert all(b - a == timedelta(minutes=15) for a, b in zip(runs, runs[1:], strict=False))
    assert body["recentCalls"][0]["dueAt"] == body["nextRuns"][0]["at"]


def test_an_interval_runs_in_real_time_across_a_dst_change_and_the_loop_makes_each_occurrence(world):
    # Europe/Berlin falls back on 2027-10-31 at 01:00 UTC: an hourly interval stays an hour apart.
    start = datetime(2027, 10, 30, 22, 0, tzinfo=UTC)
    body = interval(timezone="Europe/Berlin")
    body.update(every="1h", startAt=iso_ms(start))
    schedule_id = ApiClient(world.acme_key).post(SCHEDULES, body).json()["scheduleId"]
    schedule = Schedule.objects.get(pk=schedule_id)
    for hour in range(5):
        schedules_materialize(now=start + timedelta(hours=hour, seconds=30))
    made = sorted(call.occurrence_at for call in calls_of(schedule))
    assert made == [start + timedelta(hours=h) for h in range(6)]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"every": "30s"}, "every"),
        ({"every": "1w"}, "every"),
        ({"every": 900}, "every"),
        ({"every": "367d"}, "every"),
        ({"every": "15m", "cron": "0 * * * *"}, "every"),
    ],
)
def test_bad_intervals_are_a_400_naming_the_field(world, change, field):
    body = {**interval(), **change}
    answer = ApiClient(world.acme_key).post(SCHEDULES, body)
    assert answer.status_code == 400 and field in answer.json()["errors"], answer.json()
    assert not Schedule.objects.exists()


def test_neither_a_cron_nor_an_interval_is_refused_and_a_change_replaces_one_with_the_other(world):
    api = ApiClient(world.acme_key)
    body = interval()
    del body["every"]
    answer = api.post(SCHEDULES, body)
    assert answer.status_code == 400 and "cron" in answer.json()["errors"]
    schedule_id = api.post(SCHEDULES, schedule_payload(cron="0 * * * *", timezone="UTC")).json()["scheduleId"]
    path = f"{SCHEDULES}/{schedule_id}"
    to_interval = api.patch(path, {"every": "6h"}).json()
    assert (to_interval["cron"], to_interval["every"]) == (None, "6h")
    back = api.patch(path, {"cron": "30 2 * * *"}).json()
    assert (back["cron"], back["every"]) == ("30 2 * * *", None)


def test_the_page_and_create_schedule_take_an_interval(world):
    owner = Client()
    owner.force_login(world.owner)
    form = {
        "name": "paged",
        "every": "90m",
        "timezone": "UTC",
        "method": "GET",
        "url": "http://127.0.0.1:9/x",
        "body_format": "json",
    }
    owner.post("/schedules/new/", form)
    made = Schedule.objects.get(name="paged")
    assert made.every_s == 5400 and made.cron == ""
    assert "every 90m" in owner.get(f"/schedules/{made.pk}/").content.decode()
    assert "every 90m" in owner.get("/schedules/").content.decode()

    result = call(
        "create_schedule", "--tenant=acme", "--name=cli", "--every=6h", "--method=GET", "--url=http://127.0.0.1:9/x"
    )
    assert result.code == 0, result.err
    assert Schedule.objects.get(name="cli").every_s == 6 * 3600
    both = call(
        "create_schedule",
        "--tenant=acme",
        "--name=x",
        "--every=6h",
        "--cron=0 * * * *",
        "--method=GET",
        "--url=http://a.b/",
    )
    assert both.code != 0


def test_a_window_that_holds_no_interval_occurrence_is_refused_and_startat_anchors_to_the_millisecond(world):
    api = ApiClient(world.acme_key)
    now = datetime.now(UTC)
    body = interval()
    # Runs at -1h, +5h, ...: none before the end.
    body.update(every="6h", startAt=iso_ms(now - timedelta(hours=1)), endAt=iso_ms(now + timedelta(minutes=90)))
    answer = api.post(SCHEDULES, body)
    assert answer.status_code == 400 and "endAt" in answer.json()["errors"], answer.json()
    start = (now + timedelta(hours=1)).replace(microsecond=500_000)
    made = api.post(SCHEDULES, {**interval(), "startAt": iso_ms(start)}).json()
    assert made["nextRuns"][0]["at"] == iso_ms(start)
