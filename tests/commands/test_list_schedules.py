"""manage.py list_schedules (docs/schedules.md): a table, or --json as the REST API shows them."""

from __future__ import annotations

import json

import pytest

from tests.commands.cli import call
from tests.support.schedules import make_schedule

pytestmark = pytest.mark.django_db


def test_it_lists_the_tenants_schedules_with_their_next_run_in_their_zone(world):
    berlin = make_schedule(name="Berlin nightly", cron="30 2 * * *", timezone="Europe/Berlin")
    paused = make_schedule(name="On hold", cron="0 9 * * *", timezone="UTC", paused=True)
    make_schedule("globex", name="not acme's")

    result = call("list_schedules", "--tenant", "acme")

    assert result.code == 0, result.err
    lines = result.out.strip().splitlines()
    assert lines[0].split() == ["ID", "NAME", "CRON", "TIMEZONE", "STATE", "NEXT", "RUN", "SKIPPED"]
    berlin_line = next(line for line in lines if line.startswith(str(berlin.pk)))
    assert "Europe/Berlin" in berlin_line and "active" in berlin_line and "T02:30:00+0" in berlin_line
    paused_line = next(line for line in lines if line.startswith(str(paused.pk)))
    assert "paused" in paused_line and paused_line.split()[-2:] == ["-", "0"]
    assert "not acme's" not in result.out
    assert lines[-1] == "2 schedules"


def test_json_is_the_apis_representation(world, settings):
    settings.AGENT_BASE_URL = "http://127.0.0.1:8000"
    schedule = make_schedule(name="j", cron="0 * * * *", timezone="UTC", headers={"X-Api-Key": "k-secret"})

    result = call("list_schedules", "--tenant", "acme", "--json")

    [shown] = json.loads(result.out)
    assert shown["scheduleId"] == str(schedule.pk) and shown["state"] == "active"
    assert shown["requestSpec"]["headers"] == {"X-Api-Key": "***"}
    assert shown["links"]["self"] == f"http://127.0.0.1:8000/api/tenants/acme/schedules/{schedule.pk}"
    assert "k-secret" not in result.out


def test_no_schedules_and_an_unknown_tenant(world):
    assert call("list_schedules", "--tenant", "globex").out.strip() == "No schedules."
    refused = call("list_schedules", "--tenant", "nope")
    assert refused.code == 1
