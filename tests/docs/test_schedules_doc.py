"""docs/schedules.md stays true: every example on the page is run here.

The DST table (each row through the loop, with the clock injected), the create body and the
preview request as written, the refused crons, the missed-occurrences example with its
numbers, and the console session of the commands (ids and dates as placeholders).
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings

from orchestration.models import ServiceCall
from schedules.cron import local_iso
from schedules.materialize import schedules_materialize
from schedules.models import Schedule
from tests.commands.cli import call
from tests.support.api import ApiClient, assert_problem
from tests.support.factories import make_api_key, make_tenant
from tests.support.schedules import calls_of, make_schedule, schedule_payload

DOC = Path(__file__).resolve().parents[2] / "docs" / "schedules.md"
ROW = re.compile(
    r"^\| (?P<zone>[A-Za-z_/]+) \| (?P<day>\d{4}-\d\d-\d\d)[^|]* \| `(?P<cron>[^`]+)` \| "
    r"(?P<local>[0-9T:+-]+) \| (?P<utc>[0-9T:-]+Z) \|$",
    re.M,
)


def _example(name: str, fence: str) -> str:
    match = re.search(rf"<!-- example: {name} -->\n```{fence}\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert match, f"no {name} example"
    return match.group(1)


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_the_dst_table_has_its_rows():
    rows = list(ROW.finditer(DOC.read_text()))
    assert len(rows) == 6
    assert {row["zone"] for row in rows} == {"Europe/Berlin", "America/New_York", "UTC"}


@pytest.mark.django_db
@pytest.mark.parametrize("row", [m.groupdict() for m in ROW.finditer(DOC.read_text())], ids=lambda r: r["zone"])
def test_each_dst_row_is_the_one_run_of_its_day_through_the_loop(world, row):
    zone = ZoneInfo(row["zone"])
    day = date.fromisoformat(row["day"])
    created = datetime.combine(day - timedelta(days=1), time(12), tzinfo=zone)
    schedule = make_schedule(cron=row["cron"], timezone=row["zone"], now=created)
    day_ends = datetime.combine(day + timedelta(days=1), time(12), tzinfo=zone)
    while True:
        schedule.refresh_from_db()
        if schedule.advance_at > day_ends:
            break
        schedules_materialize(now=schedule.advance_at + timedelta(milliseconds=300))

    that_day = [call.occurrence_at for call in calls_of(schedule) if call.occurrence_at.astimezone(zone).date() == day]
    assert that_day == [_utc(row["utc"])]
    assert local_iso(that_day[0], row["zone"]) == row["local"]


@pytest.mark.django_db
def test_the_create_example_is_accepted_as_written(world):
    body = json.loads(_example("create", "json"))
    make_tenant("demo")
    _, key = make_api_key("demo")
    curl = DOC.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    post_path = urlsplit(re.search(r"-X POST (\S+)", curl).group(1)).path

    response = ApiClient(key).post(post_path, body)

    assert response.status_code == 201, response.content
    shown = response.json()
    assert (shown["name"], shown["cron"], shown["timezone"], shown["tags"]) == (
        body["name"],
        body["cron"],
        body["timezone"],
        body["tags"],
    )
    assert shown["retryPolicy"]["maxAttempts"] == 3
    assert shown["requestSpec"]["body"] == body["requestSpec"]["body"]
    assert all(run["local"][10:19] in ("T02:30:00", "T03:00:00") for run in shown["nextRuns"])
    [made] = shown["recentCalls"]
    assert made["status"] == "Scheduled" and made["correlationId"] == shown["scheduleId"]

    preview = re.search(r'curl -s "http://127\.0\.0\.1:8000(/api/[^"]+)"', curl).group(1)
    answer = ApiClient(key).get(preview)
    assert answer.status_code == 200, answer.content
    assert answer.json()["timezone"] == "America/New_York"
    assert all(re.fullmatch(r"\S+T09:00:00-0[45]:00", run["local"]) for run in answer.json()["nextRuns"])


@pytest.mark.django_db
@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 0 * 2 5#5", "*/10 * * * * *"])
def test_the_crons_the_page_says_are_refused_are(world, cron):
    assert f"`{cron}`" in DOC.read_text() or "sixth" in DOC.read_text()
    before = ServiceCall.objects.count()
    response = ApiClient(world.acme_key).post("/api/tenants/acme/schedules", schedule_payload(cron=cron))
    assert_problem(response, 400, errors_for="cron")
    assert ServiceCall.objects.count() == before


def test_the_documented_limit_is_the_default():
    assert "`MAX_SCHEDULES_PER_TENANT`\n(100)" in DOC.read_text()
    assert settings.MAX_SCHEDULES_PER_TENANT == 100


@pytest.mark.django_db
def test_the_missed_occurrences_example(world):
    text = " ".join(DOC.read_text().split())
    assert "stop at 09:50 and come back at 14:10" in text
    assert "the call for 10:00 is cancelled, `skippedCount` grows by 5" in text
    assert 'With `"catchupWindow": "2h"` the occurrences from 12:10 on run: 13:00, then 14:00' in text
    at = datetime(2026, 1, 5, tzinfo=UTC)
    by_default = make_schedule(cron="0 * * * *", timezone="UTC", now=at.replace(hour=9, minute=50))
    two_hours = make_schedule(name="2h", cron="0 * * * *", timezone="UTC", now=at.replace(hour=9, minute=50))
    Schedule.objects.filter(pk=two_hours.pk).update(catchup_window_s=7200)

    schedules_materialize(now=at.replace(hour=14, minute=10))

    by_default.refresh_from_db()
    two_hours.refresh_from_db()
    assert {c.occurrence_at.hour: c.status for c in calls_of(by_default)} == {10: "Cancelled", 15: "Scheduled"}
    assert by_default.skipped_count == 5
    assert {c.occurrence_at.hour: c.status for c in calls_of(two_hours)} == {
        10: "Cancelled",
        13: "Scheduled",
        14: "Scheduled",
        15: "Scheduled",
    }
    assert two_hours.skipped_count == 3


@pytest.mark.django_db
def test_the_console_session(world):
    make_tenant("demo")
    block = _example("commands", "console")
    commands = [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    outputs = re.split(r"^\$ .*\n", block, flags=re.M)[1:]
    assert len(commands) == len(outputs) == 2
    schedule_id = None
    for command, expected in zip(commands, outputs, strict=True):
        argv = shlex.split(command)
        assert argv[:3] == ["python", "manage.py", argv[2]]
        result = call(*argv[2:])
        assert result.code == 0, result.err
        if argv[2] == "create_schedule":
            schedule_id = result.out.strip()
            assert expected.strip() == "<schedule id>"
            assert result.err.startswith("Next runs: ")
            continue
        want = [" ".join(line.split()) for line in expected.strip().splitlines()]
        got = [" ".join(line.split()) for line in result.out.strip().splitlines()]
        assert got[0] == want[0] and got[-1] == want[-1]
        row = re.escape(want[1])
        row = row.replace(re.escape("<schedule id>"), re.escape(schedule_id))
        row = re.sub(r"<next\\ run.*?>", r"\\d{4}-\\d\\d-\\d\\dT0[23]:[03]0:00\\+0[12]:00", row)
        assert re.fullmatch(row, got[1]), (want[1], got[1])


OVERLAP_ROW = re.compile(
    r"^\| `(?P<policy>\w+)` \| (?P<first>[^|]+) \| (?P<second>[^|]+) \| (?P<third>[^|]+) \|$", re.M
)


@pytest.mark.django_db
def test_the_overlap_table_is_what_each_policy_does(world):
    """Each row played with the engine's own starts and finishes: 00:00 fails and waits for its
    retry; 00:15 falls due; the retry comes due and answers; a call 00:15 buffered starts once
    released; 00:30 falls due after all that. Times are the order of these steps."""
    from execution.outcomes import ErrorKind, Outcome
    from orchestration.services import CallKey, service_calls_finish, service_calls_start
    from schedules.making import make_occurrence_call

    section = DOC.read_text().split("<!-- example: overlap -->", 1)[1].split("\n\n", 1)[0]
    rows = {row["policy"]: row for row in OVERLAP_ROW.finditer(section) if row["policy"] != "overlap"}
    assert set(rows) == {"skip", "bufferOne", "allowAll", "cancelOther"}
    retry = {"maxAttempts": 2, "minBackoffMs": 600_000, "maxBackoffMs": 600_000, "retryOn": ["HttpError5xx"]}
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=1)
    ok = Outcome(succeeded=True, status=200)

    def started(call) -> bool:
        return bool(service_calls_start(keys=[CallKey("acme", call.pk)]))

    def answer(call, outcome=ok) -> None:
        attempt = ServiceCall.objects.get(pk=call.pk).attempts
        service_calls_finish(results=[(CallKey("acme", call.pk, attempt), outcome)])

    for policy, row in rows.items():
        schedule = make_schedule(
            name=policy, cron="*/15 * * * *", timezone="UTC", paused=True, overlap=policy, retry_policy=retry
        )
        first = make_occurrence_call(schedule, base, at_once=True)[0]
        assert started(first)
        answer(first, Outcome.failure(ErrorKind.HTTP_ERROR, "503", status=503))  # its retry waits
        second = make_occurrence_call(schedule, base + timedelta(minutes=15), at_once=True)[0]
        if started(second):
            answer(second)
        ServiceCall.objects.filter(pk=first.pk, status="Scheduled").update(due_at=datetime.now(UTC))
        if started(first):
            answer(first)
        if started(second):  # released by the retry's answer
            answer(second)
        third = make_occurrence_call(schedule, base + timedelta(minutes=30), at_once=True)[0]
        assert started(third)
        answer(third)
        first, second, third = (ServiceCall.objects.get(pk=call.pk) for call in (first, second, third))

        if row["first"].strip() == "retried at 00:20":
            assert (first.status, first.attempts) == ("Succeeded", 2), policy
        else:
            assert row["first"].strip() == "cancelled at 00:15", policy
            assert (first.status, first.overlap_state) == ("Cancelled", "superseded"), policy
        shown = row["second"].strip()
        if shown == "skipped":
            assert (second.status, second.overlap_state) == ("Cancelled", "skipped"), policy
        elif shown.startswith("runs at 00:20"):
            assert second.status == "Succeeded" and second.started_at >= first.finished_at, policy
        else:
            assert shown == "runs at 00:15", policy
            assert second.status == "Succeeded" and second.started_at <= first.finished_at, policy
        assert row["third"].strip() == "runs" and third.status == "Succeeded", policy


def test_the_two_dst_edge_cases_are_as_the_page_says():
    from schedules.cron import next_occurrences

    text = " ".join(DOC.read_text().split())
    assert "(`*/15 2 * * *`) has no run that day" in text and "(`0,30 2 * * *`) make one run after it" in text
    day = datetime(2027, 3, 28, tzinfo=ZoneInfo("Europe/Berlin"))  # spring forward in Berlin

    def runs_that_day(cron: str) -> list[datetime]:
        runs = next_occurrences(cron, "Europe/Berlin", after=day - timedelta(seconds=1), count=10)
        return [at for at in runs if at.astimezone(day.tzinfo).date() == day.date()]

    assert runs_that_day("*/15 2 * * *") == []
    assert [at.astimezone(day.tzinfo).strftime("%H:%M") for at in runs_that_day("0,30 2 * * *")] == ["03:00"]
