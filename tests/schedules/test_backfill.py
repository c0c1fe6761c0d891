"""Backfill (docs/schedules.md, "Backfill"): each occurrence of a past range without its live call
gets one, due at once, oldest first; asked twice, each call is made once; a skipped occurrence
gets its call; the range is bounded; bad input is a 400 naming the field with nothing made;
another tenant's schedule is not found. Through the API, the page and the command."""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.test import Client

from core.ids import iso_ms
from orchestration.models import ServiceCall
from schedules.materialize import schedules_materialize
from tests.commands.cli import call
from tests.support.api import ApiClient
from tests.support.factories import make_tenant
from tests.support.schedules import calls_of, make_schedule

DAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)


def backfill(client: ApiClient, schedule, **body):
    return client.post(f"/api/tenants/acme/schedules/{schedule.pk}/backfill", body)


def test_a_past_range_is_made_once_however_often_asked_and_a_skipped_occurrence_gets_its_call(world):
    api = ApiClient(world.acme_key)
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", now=DAY - timedelta(minutes=30))
    # The workers were stopped: the loop skipped 00:00 to 03:00 (its call for 00:00 cancelled).
    schedules_materialize(now=DAY + timedelta(hours=3, minutes=30))
    assert ServiceCall.objects.get(schedule_id=schedule.pk, occurrence_at=DAY).status == "Cancelled"

    answer = backfill(api, schedule, **{"from": iso_ms(DAY), "to": iso_ms(DAY + timedelta(hours=6))})
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert [c["occurrenceAt"] for c in body["calls"]] == [iso_ms(DAY + timedelta(hours=h)) for h in range(7)]
    assert body["made"] == 7 - 1 and body["alreadyMade"] == 1  # 04:00 had its call, made ahead
    live = [c for c in calls_of(schedule) if c.status != "Cancelled" and c.occurrence_at <= DAY + timedelta(hours=6)]
    assert len(live) == 7 and all(
        c.due_at <= datetime.now(UTC) for c in live if c.occurrence_at < DAY + timedelta(hours=4)
    )
    made_in_order = sorted((c for c in live if c.occurrence_at != DAY + timedelta(hours=4)), key=lambda c: c.due_at)
    assert [c.occurrence_at for c in made_in_order] == sorted(c.occurrence_at for c in made_in_order)  # oldest first

    again = backfill(api, schedule, **{"from": iso_ms(DAY), "to": iso_ms(DAY + timedelta(hours=6))}).json()
    assert (again["made"], again["alreadyMade"]) == (0, 7)
    assert ServiceCall.objects.filter(schedule_id=schedule.pk).exclude(status="Cancelled").count() == 7


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"from": "2026-01-01T00:00:00Z"}, "to"),
        ({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "to"),
        ({"from": "2026-01-01T00:00:00Z", "to": "2999-01-01T00:00:00Z"}, "to"),
        ({"from": "yesterday", "to": "2026-01-01T00:00:00Z"}, "from"),
        ({"from": "2026-01-01T00:00:00", "to": "2026-01-02T00:00:00Z"}, "from"),
        ({"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "count": 3}, "count"),
        ({"from": "2025-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "to"),  # 8760 hours
        # Year 1: its occurrences would overflow the date arithmetic (schemathesis found a 500).
        ({"from": "0001-01-01T00:00:00Z", "to": "0001-01-02T00:00:00Z"}, "from"),
        ({"from": "1969-12-31T23:00:00Z", "to": "1970-01-01T01:00:00Z"}, "from"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_makes_nothing(world, body, field):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC")
    before = ServiceCall.objects.count()
    answer = backfill(ApiClient(world.acme_key), schedule, **body)
    assert answer.status_code == 400 and field in answer.json()["errors"], answer.json()
    assert ServiceCall.objects.count() == before


def test_another_tenants_schedule_is_not_found(world):
    theirs = make_schedule("globex", cron="0 * * * *", timezone="UTC")
    answer = backfill(
        ApiClient(world.acme_key), theirs, **{"from": iso_ms(DAY), "to": iso_ms(DAY + timedelta(hours=1))}
    )
    assert answer.status_code == 404
    assert not ServiceCall.objects.filter(schedule_id=theirs.pk, occurrence_at__lt=datetime.now(UTC)).exists()


def test_the_page_and_the_command_run_a_range(world):
    schedule = make_schedule(cron="0 * * * *", timezone="Europe/Berlin")
    owner = Client()
    owner.force_login(world.owner)
    local = DAY.astimezone(ZoneInfo("Europe/Berlin"))  # the page takes the range in the schedule's zone
    form = {"from": local.strftime("%Y-%m-%dT%H:%M"), "to": (local + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")}
    page = owner.post(f"/schedules/{schedule.pk}/backfill", form, follow=True)
    assert "3 occurrence(s) of the range run now" in page.content.decode()

    result = call(
        "backfill_schedule",
        "--tenant=acme",
        str(schedule.pk),
        f"--from={iso_ms(DAY)}",
        f"--to={iso_ms(DAY + timedelta(hours=3))}",
    )
    assert result.code == 0, result.err
    lines = result.out.strip().splitlines()
    assert [line.split()[2:] for line in lines] == [["had", "its", "call"]] * 3 + [["made"]]
    assert result.err.strip() == "1 made, 3 had their call already."
    refused = call("backfill_schedule", "--tenant=acme", str(schedule.pk), "--from=x", "--to=2026-01-01T00:00:00Z")
    assert refused.code == 1 and "--from" in refused.err


def test_the_documented_command_runs_as_written(world):
    make_tenant("demo")
    schedule = make_schedule("demo", cron="0 * * * *", timezone="UTC")
    text = (Path(__file__).resolve().parents[2] / "docs" / "schedules.md").read_text()
    section = text.split("## Backfill", 1)[1].split("\n## ", 1)[0]
    (line,) = re.findall(r"^python manage.py backfill_schedule .*$", section, flags=re.M)
    argv = shlex.split(line.replace("<schedule id>", str(schedule.pk)))[2:]
    result = call(*argv)
    assert result.code == 0, result.err
    assert len(result.out.strip().splitlines()) == 7 and "seven occurrences, 00:00 to 06:00 inclusive" in section
    made = ServiceCall.objects.filter(schedule_id=schedule.pk, occurrence_at__lt=datetime.now(UTC))
    assert set(made.values_list("overlap", flat=True)) == {"allowAll"}  # the command's --overlap
