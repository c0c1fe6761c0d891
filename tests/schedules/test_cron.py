"""schedules.cron: which cron expressions and zones are accepted, and the occurrence times
across DST (Debian cron's rules: a skipped local time runs once right after the jump, a
repeated one runs once)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from schedules.cron import CronError, local_iso, next_occurrences, parse_cron, parse_zone, runs_soon


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def daily(cron: str, zone: str, *, after: datetime, count: int = 3) -> list[str]:
    return [local_iso(at, zone) for at in next_occurrences(cron, zone, after=after, count=count)]


def test_berlin_spring_forward_runs_the_skipped_half_past_two_once_right_after_the_jump():
    # 2027-03-28: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day.
    assert daily("30 2 * * *", "Europe/Berlin", after=utc(2027, 3, 27, 12)) == [
        "2027-03-28T03:00:00+02:00",
        "2027-03-29T02:30:00+02:00",
        "2027-03-30T02:30:00+02:00",
    ]


def test_berlin_fall_back_runs_the_repeated_half_past_two_once():
    # 2027-10-31: 03:00 CEST becomes 02:00 CET; 02:30 happens twice and runs on its first pass.
    runs = next_occurrences("30 2 * * *", "Europe/Berlin", after=utc(2027, 10, 30, 12), count=3)
    assert runs == [utc(2027, 10, 31, 0, 30), utc(2027, 11, 1, 1, 30), utc(2027, 11, 2, 1, 30)]
    assert [local_iso(at, "Europe/Berlin") for at in runs] == [
        "2027-10-31T02:30:00+02:00",
        "2027-11-01T02:30:00+01:00",
        "2027-11-02T02:30:00+01:00",
    ]


def test_new_york_spring_forward_and_fall_back():
    # 2027-03-14: 02:00 EST becomes 03:00 EDT.
    assert daily("30 2 * * *", "America/New_York", after=utc(2027, 3, 13, 12)) == [
        "2027-03-14T03:00:00-04:00",
        "2027-03-15T02:30:00-04:00",
        "2027-03-16T02:30:00-04:00",
    ]
    # 2027-11-07: 02:00 EDT becomes 01:00 EST, so 02:30 happens once and 01:30 twice.
    assert daily("30 2 * * *", "America/New_York", after=utc(2027, 11, 6, 12)) == [
        "2027-11-07T02:30:00-05:00",
        "2027-11-08T02:30:00-05:00",
        "2027-11-09T02:30:00-05:00",
    ]
    assert daily("30 1 * * *", "America/New_York", after=utc(2027, 11, 6, 12), count=2) == [
        "2027-11-07T01:30:00-04:00",
        "2027-11-08T01:30:00-05:00",
    ]


def test_a_utc_schedule_ignores_every_dst_change():
    for after in (utc(2027, 3, 27, 12), utc(2027, 10, 30, 12), utc(2027, 3, 13, 12), utc(2027, 11, 6, 12)):
        runs = next_occurrences("30 2 * * *", "UTC", after=after, count=3)
        assert [(at.hour, at.minute) for at in runs] == [(2, 30)] * 3
        assert [(b - a).total_seconds() for a, b in zip(runs, runs[1:], strict=False)] == [86400.0, 86400.0]


def test_an_interval_schedule_runs_through_the_repeated_hour_in_real_time():
    # Every 30 minutes across Berlin's fall-back: the repeated hour's runs all happen, in order.
    runs = next_occurrences("*/30 * * * *", "Europe/Berlin", after=utc(2027, 10, 30, 23, 45), count=6)
    assert runs == [
        utc(2027, 10, 31, 0),
        utc(2027, 10, 31, 0, 30),
        utc(2027, 10, 31, 1),
        utc(2027, 10, 31, 1, 30),
        utc(2027, 10, 31, 2),
        utc(2027, 10, 31, 2, 30),
    ]


def test_start_and_end_bound_the_occurrences():
    runs = next_occurrences(
        "0 * * * *", "UTC", after=utc(2027, 1, 1), count=10, start_at=utc(2027, 1, 1, 5), end_at=utc(2027, 1, 1, 7)
    )
    assert runs == [utc(2027, 1, 1, 5), utc(2027, 1, 1, 6), utc(2027, 1, 1, 7)]


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("", "cron is required"),
        ("* * * * * *", "intervals under a minute"),
        ("0 30 2 * * *", "6 fields"),
        ("* * * *", "exactly 5 fields"),
        ("* * * * * * *", "exactly 5 fields"),
        ("61 * * * *", "its minute field is .61., and minute must be 0-59"),
        ("0 0 30 2 *", "30 February"),
        ("0 0 * * FUNDAY", "day-of-week must be 0-7 or sun-sat"),
        ("0 0 * * 1\x00", "printable ASCII"),
        ("0 " * 100, "at most 120"),
        (5, "cron is required"),
    ],
)
def test_it_refuses_what_is_not_a_five_field_cron(cron, message):
    with pytest.raises(CronError, match=message):
        parse_cron(cron)


def test_it_normalises_spaces_and_accepts_names():
    assert parse_cron("  30   2 *\t* mon-fri ") == "30 2 * * mon-fri"
    assert parse_cron("0 9 1 JAN,JUL *") == "0 9 1 JAN,JUL *"


def test_a_cron_that_never_comes_soon_is_told_apart():
    now = utc(2027, 1, 1)
    assert runs_soon("0 0 29 2 1", "UTC", now=now)  # 29 February, or any Monday in February
    assert runs_soon("0 0 29 2 *", "UTC", now=now)  # 2028-02-29
    # A fifth Friday in February: 2036 next, then 2064.
    assert parse_cron("0 0 * 2 5#5") == "0 0 * 2 5#5"
    assert not runs_soon("0 0 * 2 5#5", "UTC", now=now)


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "UTC", "Asia/Kolkata"])
def test_it_accepts_iana_zones(zone):
    assert parse_zone(zone) == zone


@pytest.mark.parametrize("zone", ["Mars/Olympus", "localtime", "posix/Europe/Berlin", "../etc/passwd", "", 3])
def test_it_refuses_anything_else_as_a_zone(zone):
    with pytest.raises(CronError, match="IANA"):
        parse_zone(zone)


def test_no_zone_is_utc():
    assert parse_zone(None) == "UTC"
