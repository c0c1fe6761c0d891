"""The DST choices (docs/schedules.md, "The DST choices"): `dstSkipped` (afterJump | skip) and
`dstRepeated` (once | twice) in Europe/Berlin, America/New_York and Australia/Sydney; a skipped
run counted and raised by the loop; what each choice does shown on the schedule and the preview;
bad values a 400 naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from core.ids import iso_ms
from outbox.models import OutboxEvent
from schedules.cron import occurrences
from schedules.materialize import schedules_materialize
from schedules.models import Schedule
from tests.commands.cli import call
from tests.support.api import ApiClient
from tests.support.schedules import calls_of, make_schedule, schedule_payload


def runs_of_day(cron: str, zone: str, day: str, **choices) -> list[str]:
    """The local times of the runs on a local day."""
    tz = ZoneInfo(zone)
    start = datetime.fromisoformat(day).replace(tzinfo=tz).astimezone(UTC)
    found = occurrences(
        cron, zone, after=start - timedelta(microseconds=1), end_at=start + timedelta(hours=24), **choices
    )
    return [at.astimezone(tz).isoformat() for at in found]


@pytest.mark.parametrize(
    ("zone", "cron", "day", "after_jump"),
    [
        ("Europe/Berlin", "30 2 * * *", "2027-03-28", "2027-03-28T03:00:00+02:00"),
        ("America/New_York", "30 2 * * *", "2027-03-14", "2027-03-14T03:00:00-04:00"),
        ("Australia/Sydney", "30 2 * * *", "2027-10-03", "2027-10-03T03:00:00+11:00"),
    ],
)
def test_a_local_time_the_jump_skips_runs_after_it_or_not_at_all(zone, cron, day, after_jump):
    assert runs_of_day(cron, zone, day) == [after_jump]
    assert runs_of_day(cron, zone, day, dst_skipped="skip") == []
    # The days around it are untouched by the choice.
    before = (datetime.fromisoformat(day) - timedelta(days=1)).date().isoformat()
    assert runs_of_day(cron, zone, before, dst_skipped="skip") == runs_of_day(cron, zone, before)


@pytest.mark.parametrize(
    ("zone", "cron", "day", "passes"),
    [
        ("Europe/Berlin", "30 2 * * *", "2027-10-31", ["2027-10-31T02:30:00+02:00", "2027-10-31T02:30:00+01:00"]),
        ("America/New_York", "30 1 * * *", "2027-11-07", ["2027-11-07T01:30:00-04:00", "2027-11-07T01:30:00-05:00"]),
        ("Australia/Sydney", "30 2 * * *", "2027-04-04", ["2027-04-04T02:30:00+11:00", "2027-04-04T02:30:00+10:00"]),
    ],
)
def test_a_local_time_the_fall_back_repeats_runs_once_or_on_both_passes(zone, cron, day, passes):
    assert runs_of_day(cron, zone, day) == passes[:1]
    assert runs_of_day(cron, zone, day, dst_repeated="twice") == passes


def test_the_loop_skips_the_jumped_run_counts_it_and_raises_its_event(world):
    # Berlin's jump, 2027-03-28 01:00 UTC: a 02:30 schedule made two days before.
    start = datetime(2027, 3, 26, 12, tzinfo=UTC)
    skipping = make_schedule(name="skip", cron="30 2 * * *", timezone="Europe/Berlin", now=start)
    jumping = make_schedule(name="jump", cron="30 2 * * *", timezone="Europe/Berlin", now=start)
    Schedule.objects.filter(pk=skipping.pk).update(dst_skipped="skip")
    skipping.refresh_from_db()
    for _ in range(3):  # the 27th, the 28th (the jump), the 29th
        for schedule in (skipping, jumping):
            fresh = Schedule.objects.get(pk=schedule.pk)
            if fresh.advance_at is not None:
                schedules_materialize(now=fresh.advance_at + timedelta(seconds=5))
    jumped_day = datetime(2027, 3, 28, tzinfo=UTC)
    on_jump_day = [
        c.occurrence_at for c in calls_of(jumping) if jumped_day <= c.occurrence_at < jumped_day + timedelta(days=1)
    ]
    assert on_jump_day == [datetime(2027, 3, 28, 1, 0, tzinfo=UTC)]  # 03:00 CEST, right after the jump
    assert not [c for c in calls_of(skipping) if jumped_day <= c.occurrence_at < jumped_day + timedelta(days=1)]
    skipping.refresh_from_db()
    assert skipping.skipped_reasons == {"dstSkipped": 1}
    [event] = OutboxEvent.objects.filter(aggregate_id=skipping.pk, event_type="ScheduleOccurrenceSkipped")
    assert event.event_payload["payload"] == {
        "scheduleId": str(skipping.pk),
        "occurrenceAt": iso_ms(datetime(2027, 3, 28, 1, 0, tzinfo=UTC)),
        "reason": "dstSkipped",
    }


def test_the_api_and_the_preview_show_what_each_choice_does_on_the_next_transition(world):
    api = ApiClient(world.acme_key)
    made = api.post(
        "/api/tenants/acme/schedules",
        schedule_payload(cron="30 2 * * *", timezone="Europe/Berlin", dstRepeated="twice", dstSkipped="skip"),
    )
    assert made.status_code == 201, made.json()
    body = made.json()
    assert (body["dstSkipped"], body["dstRepeated"]) == ("skip", "twice")
    # 02:30 in Berlin falls in both of its transitions: whichever comes next, the choices differ there.
    transition = body["nextDstTransition"]
    assert transition["kind"] in ("springForward", "fallBack")
    first, second = transition["runs"].values()
    assert set(transition["runs"]) in ({"afterJump", "skip"}, {"once", "twice"}) and first != second
    preview = api.get(
        "/api/tenants/acme/schedules/preview", {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "dstSkipped": "skip"}
    ).json()
    shown = preview["nextDstTransition"]
    assert shown["kind"] in ("springForward", "fallBack") and len(shown["runs"]) == 2
    bad = api.get("/api/tenants/acme/schedules/preview", {"cron": "30 2 * * *", "dstRepeated": "thrice"})
    assert bad.status_code == 400 and "dstRepeated" in bad.json()["errors"]


@pytest.mark.parametrize(("field", "value"), [("dstSkipped", "later"), ("dstRepeated", "thrice"), ("dstSkipped", None)])
def test_bad_choices_are_a_400_naming_the_field(world, field, value):
    answer = ApiClient(world.acme_key).post("/api/tenants/acme/schedules", schedule_payload(**{field: value}))
    assert answer.status_code == 400 and field in answer.json()["errors"]
    assert not Schedule.objects.exists()


def test_create_schedule_takes_the_choices_and_the_docs_say_them(world):
    result = call(
        "create_schedule",
        "--tenant=acme",
        "--name=cli",
        "--cron=30 2 * * *",
        "--timezone=Europe/Berlin",
        "--dst-skipped=skip",
        "--dst-repeated=twice",
        "--method=GET",
        "--url=http://127.0.0.1:9/x",
    )
    assert result.code == 0, result.err
    made = Schedule.objects.get(name="cli")
    assert (made.dst_skipped, made.dst_repeated) == ("skip", "twice")
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "schedules.md").read_text().split())
    assert "`afterJump` runs at 03:00 local and `skip` runs nothing that day" in text
    assert runs_of_day("30 2 * * *", "Europe/Berlin", "2027-03-28", dst_skipped="skip") == []
    assert "`once` runs at 01:30 EDT and `twice` at 01:30 EDT and 01:30 EST" in text
    assert len(runs_of_day("30 1 * * *", "America/New_York", "2027-11-07", dst_repeated="twice")) == 2
    assert "the jump is on 2027-10-03 and the repeat on 2027-04-04" in text


def test_the_loop_makes_both_passes_with_twice(world):
    # Berlin falls back on 2027-10-31 (02:30 local twice: 00:30Z and 01:30Z).
    start = datetime(2027, 10, 29, 12, tzinfo=UTC)
    schedule = make_schedule(name="twice", cron="30 2 * * *", timezone="Europe/Berlin", now=start)
    Schedule.objects.filter(pk=schedule.pk).update(dst_repeated="twice")
    for _ in range(4):
        fresh = Schedule.objects.get(pk=schedule.pk)
        schedules_materialize(now=fresh.advance_at + timedelta(seconds=5))
    made = sorted(c.occurrence_at for c in calls_of(schedule) if c.status != "Cancelled")
    fall_back = [at for at in made if at.date() == datetime(2027, 10, 31).date()]
    assert fall_back == [datetime(2027, 10, 31, 0, 30, tzinfo=UTC), datetime(2027, 10, 31, 1, 30, tzinfo=UTC)]


def test_a_rename_plans_nothing_again_and_a_change_of_choice_applies(world):
    api = ApiClient(world.acme_key)
    schedule = make_schedule(name="plain", cron="30 2 * * *", timezone="Europe/Berlin")
    made_ahead = calls_of(schedule)[0].pk
    renamed = api.patch(f"/api/tenants/acme/schedules/{schedule.pk}", {"name": "renamed"})
    assert renamed.status_code == 200, renamed.json()
    assert [c.pk for c in calls_of(schedule) if c.status == "Scheduled"] == [made_ahead]  # not planned again
    changed = api.patch(f"/api/tenants/acme/schedules/{schedule.pk}", {"dstRepeated": "twice", "dstSkipped": "skip"})
    assert (changed.json()["dstRepeated"], changed.json()["dstSkipped"]) == ("twice", "skip")
    schedule.refresh_from_db()
    assert (schedule.dst_repeated, schedule.dst_skipped) == ("twice", "skip")
