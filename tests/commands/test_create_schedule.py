"""manage.py create_schedule (docs/schedules.md): thin over the schedules services, checked as
the API checks; a refused input exits 1 with every mistake named by its option, and stores
nothing."""

from __future__ import annotations

import pytest

from core.secrets import unseal_headers
from orchestration.models import ServiceCall
from schedules.models import Schedule
from tests.commands.cli import call, run_manage
from tests.support.factories import make_tenant

URL = "http://127.0.0.1:9/report"


@pytest.fixture
def acme(db):
    return make_tenant("acme")


def stored() -> tuple[int, int]:
    return Schedule.objects.count(), ServiceCall.objects.count()


def test_it_prints_the_id_and_the_next_runs(acme):
    result = call(
        "create_schedule",
        "--tenant", "acme",
        "--name", "weekday report",
        "--cron", "0 9 * * 1-5",
        "--timezone", "Europe/Berlin",
        "--method", "POST",
        "--url", URL,
        "--header", "Authorization: Bearer cli-secret-3",
        "--body", '{"weekly": false}',
        "--json-body",
        "--tag", "reports",
        "--tag", "weekday",
        "--end-at", "2099-12-31T00:00:00Z",
    )  # fmt: skip

    assert result.code == 0, result.err
    schedule = Schedule.objects.get()
    assert result.out.strip() == str(schedule.pk)
    assert result.err.startswith("Next runs: ") and result.err.count("T09:00:00+0") == 3
    assert (schedule.name, schedule.cron, schedule.timezone, schedule.tags) == (
        "weekday report",
        "0 9 * * 1-5",
        "Europe/Berlin",
        ["reports", "weekday"],
    )
    assert schedule.request_spec["body"] == {"weekly": False}
    assert unseal_headers(schedule.request_spec["headers"]) == {"Authorization": "Bearer cli-secret-3"}
    assert schedule.end_at.isoformat() == "2099-12-31T00:00:00+00:00"
    assert ServiceCall.objects.get().schedule_id == schedule.pk


def test_paused_makes_no_call(acme):
    result = call(
        "create_schedule", "--tenant", "acme", "--name", "later", "--cron", "0 0 * * *", "--method", "GET",
        "--url", URL, "--paused",
    )  # fmt: skip

    assert result.code == 0, result.err
    assert "Paused" in result.err
    assert Schedule.objects.get().paused and ServiceCall.objects.count() == 0


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--cron", "*/10 * * * * *"], "--cron: cron has 6 fields"),
        (["--cron", "0 0 30 2 *"], "--cron: cron is not valid"),
        (["--cron", "0 0 * * *", "--timezone", "Moon/Base"], "--timezone: timezone must be an IANA"),
        (["--cron", "0 0 * * *", "--end-at", "2001-01-01T00:00:00Z"], "--end-at: endAt must be in the future"),
        (["--cron", "0 0 * * *", "--start-at", "soon"], "--start-at: startAt is not a valid"),
        (["--cron", "0 0 * * *", "--url", "ftp://x/"], "--url:"),
    ],
)
def test_bad_input_exits_1_naming_the_option_and_stores_nothing(acme, args, shown):
    base = ["create_schedule", "--tenant", "acme", "--name", "x", "--method", "GET", "--url", URL]
    # A later option wins: the case's own --url replaces the base one.
    result = call(*base, *args)

    assert result.code == 1
    assert shown in result.err, result.err
    assert stored() == (0, 0)


def test_an_unknown_tenant_is_refused(db):
    result = call("create_schedule", "--tenant", "nope", "--name", "x", "--cron", "0 0 * * *", "--method", "GET",
                  "--url", URL)  # fmt: skip
    assert result.code == 1 and "create_tenant nope" in result.err
    assert stored() == (0, 0)


@pytest.mark.django_db(transaction=True)
def test_from_the_command_line_a_missing_option_is_a_usage_error(acme):
    result = run_manage("create_schedule", "--tenant", "acme", "--name", "x", "--method", "GET", "--url", URL)
    assert result.code == 2 and "--cron" in result.err
    assert stored() == (0, 0)


def test_help_says_what_it_does(acme):
    result = run_manage("create_schedule", "--help")
    assert result.code == 0
    assert "--cron" in result.out and "--timezone" in result.out and "--paused" in result.out
