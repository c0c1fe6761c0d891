"""A schedule's catch-up window and the note of its pause (docs/schedules.md): taken and shown by
the API, the pages and `create_schedule`, checked alike (a 400 naming the field, nothing
stored); a skipped occurrence is an event in the feed and a count on /metrics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from outbox.models import OutboxEvent
from outbox.services import outbox_mark_published
from schedules.materialize import schedules_materialize
from schedules.models import Schedule
from tests.commands.cli import call
from tests.support.api import ApiClient
from tests.support.schedules import make_schedule, schedule_payload

SCHEDULES = "/api/tenants/acme/schedules"


def test_the_api_takes_and_shows_the_window_and_the_note_and_a_resume_clears_the_note(world):
    api = ApiClient(world.acme_key)
    made = api.post(
        SCHEDULES, schedule_payload(catchupWindow="2h", paused=True, pausedNote="  waiting for the vendor  ")
    )
    assert made.status_code == 201, made.json()
    shown = made.json()
    assert (shown["catchupWindow"], shown["pausedNote"], shown["skippedByReason"]) == (
        "2h",
        "waiting for the vendor",
        {},
    )
    path = f"{SCHEDULES}/{shown['scheduleId']}"
    resumed = api.patch(path, {"paused": False}).json()
    assert resumed["pausedNote"] is None and resumed["catchupWindow"] == "2h"
    paused = api.patch(path, {"paused": True, "pausedNote": "maintenance", "catchupWindow": "90s"}).json()
    assert (paused["pausedNote"], paused["catchupWindow"]) == ("maintenance", "90s")
    assert api.patch(path, {"catchupWindow": "120s"}).json()["catchupWindow"] == "2m"
    # The default: one minute.
    assert api.post(SCHEDULES, schedule_payload(name="plain")).json()["catchupWindow"] == "1m"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"catchupWindow": "31d"}, "catchupWindow"),
        ({"catchupWindow": "1w"}, "catchupWindow"),
        ({"catchupWindow": 60}, "catchupWindow"),
        ({"catchupWindow": ""}, "catchupWindow"),
        ({"pausedNote": "why"}, "pausedNote"),  # not paused
        ({"paused": True, "pausedNote": "x" * 501}, "pausedNote"),
        ({"paused": True, "pausedNote": "a\u202eb"}, "pausedNote"),
        ({"paused": True, "pausedNote": 5}, "pausedNote"),
    ],
)
def test_bad_values_are_a_400_naming_the_field_and_store_nothing(world, body, field):
    answer = ApiClient(world.acme_key).post(SCHEDULES, schedule_payload(**body))
    assert answer.status_code == 400 and field in answer.json()["errors"], answer.json()
    assert not Schedule.objects.exists()


def test_a_note_on_an_active_schedule_is_refused(world):
    api = ApiClient(world.acme_key)
    schedule_id = api.post(SCHEDULES, schedule_payload()).json()["scheduleId"]
    answer = api.patch(f"{SCHEDULES}/{schedule_id}", {"pausedNote": "why"})
    assert answer.status_code == 400 and "pausedNote" in answer.json()["errors"]


def test_the_pages_pause_with_a_note_and_create_with_a_window(world):
    owner = Client()
    owner.force_login(world.owner)
    schedule = make_schedule(cron="0 * * * *", timezone="UTC")
    owner.post(f"/schedules/{schedule.pk}/paused", {"paused": "true", "note": "vendor down"})
    schedule.refresh_from_db()
    assert schedule.paused and schedule.paused_note == "vendor down"
    assert "Why: vendor down" in owner.get(f"/schedules/{schedule.pk}/").content.decode()
    assert "vendor down" in owner.get("/schedules/").content.decode()

    form = {
        "name": "windowed",
        "cron": "30 2 * * *",
        "timezone": "UTC",
        "method": "GET",
        "url": "http://127.0.0.1:9/x",
        "body_format": "json",
        "catchup_window": "6h",
    }
    assert owner.post("/schedules/new/", {**form, "catchup_window": "6 hours"}).status_code == 400
    owner.post("/schedules/new/", form)
    made = Schedule.objects.get(name="windowed")
    assert made.catchup_window_s == 6 * 3600
    assert "6h" in owner.get(f"/schedules/{made.pk}/").content.decode()


def test_create_schedule_takes_the_window_and_the_note(world):
    result = call(
        "create_schedule",
        "--tenant=acme",
        "--name=cli",
        "--cron=0 3 * * *",
        "--method=GET",
        "--url=http://127.0.0.1:9/x",
        "--catchup-window=30m",
        "--paused",
        "--paused-note=until Monday",
    )
    assert result.code == 0, result.err
    made = Schedule.objects.get(name="cli")
    assert (made.catchup_window_s, made.paused_note) == (1800, "until Monday")
    refused = call(
        "create_schedule",
        "--tenant=acme",
        "--name=x",
        "--cron=0 3 * * *",
        "--method=GET",
        "--url=http://a.b/",
        "--catchup-window=1y",
    )
    assert refused.code == 1 and "--catchup-window: catchupWindow is a whole number" in refused.err


def test_a_skipped_occurrence_is_in_the_feed_and_on_metrics(world, client):
    at = datetime(2026, 1, 5, 9, 50, tzinfo=UTC)
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=at)
    schedules_materialize(now=at + timedelta(hours=3))
    ids = list(OutboxEvent.objects.filter(published_at__isnull=True).values_list("id", flat=True))
    outbox_mark_published(ids=ids, at=datetime.now(UTC))  # as the dispatcher marks what it published
    events = ApiClient(world.acme_key).get("/api/tenants/acme/events?types=ScheduleOccurrenceSkipped").json()["data"]
    assert [e["payload"]["reason"] for e in events] == ["catchupWindow"] * 3
    assert {e["aggregateId"] for e in events} == {str(schedule.pk)}
    metrics = client.get("/metrics").content.decode()
    assert 'serviceagent_schedule_occurrences_skipped{reason="catchupWindow"} 3.0' in metrics
