"""Cron expressions in a time zone: checking them and listing their occurrences.

Pure rules, no database (docs/schedules.md): five fields (minute hour day-of-month month
day-of-week) evaluated by `cronsim` in the schedule's own IANA zone, with Debian cron's rules
across DST: a local time the spring-forward jump skips runs once right after the jump, and a
local time the fall-back repeats runs once (its first pass). Every occurrence is returned as
an instant in UTC, strictly increasing. An occurrence's call may be due a little later: the
schedule's jitter (`jitter_of`).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError

from core.ids import iso_ms

DEFAULT_ZONE = "UTC"
MAX_CRON = 120
# A cron must match a date this soon, or it is refused: "0 0 30 2 *" never runs, and one
# that runs only every few decades is a mistake too (29 February on a Monday still passes).
LOOKAHEAD = timedelta(days=5 * 366)
FIELDS = "minute hour day-of-month month day-of-week"
_PRINTABLE_ASCII = re.compile(r"[ -~]+\Z")
# Names in the system's zone database that are not zones a user means: the machine's own
# setting (differs from host to host) and the database's internal variants.
_NOT_ZONES = {"localtime", "posixrules", "Factory"}


# What each field takes, as Debian's crontab(5) says it (for the error messages).
FIELD_RANGES = {
    "minute": "0-59",
    "hour": "0-23",
    "day-of-month": "1-31",
    "month": "1-12 or jan-dec",
    "day-of-week": "0-7 or sun-sat (0 and 7 are Sunday)",
}


class CronError(ValueError):
    """Why a cron expression or a zone name is refused; the message is for the user."""


def parse_cron(raw: object) -> str:
    """The expression normalised (single spaces), or CronError: exactly five fields that
    cronsim accepts. Six fields (a seconds field) are refused: intervals under a minute."""
    if not isinstance(raw, str) or not raw.strip():
        raise CronError(f"cron is required: five fields, {FIELDS} (for example '30 2 * * *').")
    if len(raw) > MAX_CRON:
        raise CronError(f"cron must be at most {MAX_CRON} characters.")
    text = " ".join(raw.split())
    if not _PRINTABLE_ASCII.match(text):
        raise CronError("cron may contain only printable ASCII characters.")
    fields = text.split(" ")
    if len(fields) == 6:
        raise CronError(
            f"cron has 6 fields: a seconds field (intervals under a minute) is not supported; give 5 fields, {FIELDS}."
        )
    if len(fields) != 5:
        raise CronError(f"cron must have exactly 5 fields, {FIELDS}; it has {len(fields)}.")
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        message = str(exc).lower()
        for field, (name, allowed) in zip(fields, FIELD_RANGES.items(), strict=True):
            if name in message:
                message = f"its {name} field is {field!r}, and {name} must be {allowed}"
                break
        if "day-of-month" in message:
            message += " (or it is a day none of the months in the month field has, like 30 February)"
        raise CronError(f"cron is not valid: {message}.") from None
    except Exception:  # a malformed field cronsim does not expect: refused, never a 500
        raise CronError(f"cron is not valid: give 5 fields, {FIELDS}.") from None
    return text


@lru_cache(maxsize=1)
def zone_names() -> frozenset[str]:
    """The IANA zone names a schedule may use (the system's zone database)."""
    return frozenset(
        name for name in available_timezones() if name not in _NOT_ZONES and not name.startswith(("posix/", "right/"))
    )


def parse_zone(raw: object) -> str:
    """An IANA zone name ("Europe/Berlin", "UTC"); None means UTC. CronError otherwise."""
    if raw is None:
        return DEFAULT_ZONE
    if not isinstance(raw, str) or raw not in zone_names():
        raise CronError("timezone must be an IANA time zone name, for example 'Europe/Berlin' or 'UTC'.")
    return raw


# The DST choices (docs/schedules.md, "Daylight saving time"): a local time the spring-forward jump
# skips runs right after the jump (`afterJump`, Debian cron's rule) or not at all (`skip`); a
# local time the fall-back repeats runs on its first pass (`once`) or on both (`twice`).
DST_SKIPPED = ("afterJump", "skip")
DST_REPEATED = ("once", "twice")
# How far back `twice` looks for a first pass whose second pass is still to come (offsets change
# by two hours at most).
REPEAT_LOOKBACK = timedelta(hours=3)


def occurrences(
    cron: str,
    zone: str,
    *,
    after: datetime,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    dst_skipped: str = "afterJump",
    dst_repeated: str = "once",
) -> Iterator[datetime]:
    """The occurrences strictly after `after`, at or after `start_at`, at or before `end_at`:
    instants in UTC, strictly increasing, under the DST choices. Stops when cronsim finds none
    for 50 years."""
    if start_at is not None and start_at > after:
        after = start_at - timedelta(microseconds=1)
    tz = ZoneInfo(zone)
    # With `twice`, cronsim starts a few hours back: a first pass at or before `after` still
    # gives its second pass, which may come after it.
    found = CronSim(cron, (after - REPEAT_LOOKBACK if dst_repeated == "twice" else after).astimezone(tz))
    last = after
    pending: list[datetime] = []  # second passes of repeated local times, yet to come
    while True:
        try:
            local = next(found)
        except StopIteration:
            local = None
        at = local.astimezone(UTC) if local is not None else None
        while pending and (at is None or pending[0] <= at):
            extra = pending.pop(0)
            if extra > last and (end_at is None or extra <= end_at):
                last = extra
                yield extra
        if at is None:
            return
        # cronsim walks local wall-clock time: on a fall-back day a local time past the one
        # it started from can be an earlier instant (the repeated hour). Never step back.
        twin = second_pass(local) if dst_repeated == "twice" else None
        if twin is not None and twin > last and twin not in pending:
            pending.append(twin)
            pending.sort()
        if at <= last:
            continue
        if end_at is not None and at > end_at and not pending:
            return
        if dst_skipped == "skip" and shifted_by_jump(found, local):
            continue
        if end_at is not None and at > end_at:
            continue
        last = at
        yield at


def shifted_by_jump(found: CronSim, local: datetime) -> bool:
    """Whether cronsim gave `local` for a local time the spring-forward jump skipped (it runs
    right after the jump): its wall-clock hour or minute is not the cron's."""
    return local.minute not in found.minutes or local.hour not in found.hours


def second_pass(local: datetime) -> datetime | None:
    """The instant of `local`'s wall-clock time on the fall-back's second pass, when the time is
    repeated and `local` is its first pass; else None."""
    first = local.replace(fold=0).astimezone(UTC)
    second = local.replace(fold=1).astimezone(UTC)
    return second if second != first and local.astimezone(UTC) == first else None


def next_occurrences(
    cron: str,
    zone: str,
    *,
    after: datetime,
    count: int,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    dst_skipped: str = "afterJump",
    dst_repeated: str = "once",
) -> list[datetime]:
    found = []
    choices = {"dst_skipped": dst_skipped, "dst_repeated": dst_repeated}
    for at in occurrences(cron, zone, after=after, start_at=start_at, end_at=end_at, **choices):
        found.append(at)
        if len(found) >= count:
            break
    return found


def runs_soon(cron: str, zone: str, *, now: datetime) -> bool:
    """Whether the cron has an occurrence within LOOKAHEAD of `now`."""
    return bool(next_occurrences(cron, zone, after=now, count=1, end_at=now + LOOKAHEAD))


def local_iso(at: datetime, zone: str) -> str:
    """An instant as the schedule's zone shows it: 2026-03-29T03:00:00+02:00."""
    return at.astimezone(ZoneInfo(zone)).isoformat(timespec="seconds")


def jitter_of(schedule_id: uuid.UUID, at: datetime, jitter_ms: int) -> timedelta:
    """How much later than its instant the occurrence `at`'s call is due: an offset in
    [0, jitter_ms) drawn from the schedule's id and the occurrence, so the same on every cluster
    and in every preview (docs/schedules.md, "Jitter")."""
    if jitter_ms <= 0:
        return timedelta(0)
    digest = hashlib.sha256(f"{schedule_id}/{iso_ms(at)}".encode()).digest()
    return timedelta(milliseconds=int.from_bytes(digest[:8], "big") % jitter_ms)


# An interval schedule (`every`) runs at least a minute apart, at most a year.
MIN_EVERY_S = 60
MAX_EVERY_S = 366 * 86400


def interval_occurrences(
    every_s: int,
    anchor: datetime,
    *,
    after: datetime,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> Iterator[datetime]:
    """An interval schedule's occurrences strictly after `after`: `anchor` + k * `every_s` (k >= 0),
    at or after `start_at`, at or before `end_at`. Real time: a DST change moves nothing."""
    if start_at is not None and start_at > after:
        after = start_at - timedelta(microseconds=1)
    step = timedelta(seconds=every_s)
    k = 0 if after < anchor else (after - anchor) // step + 1
    at = anchor + k * step
    while end_at is None or at <= end_at:
        yield at
        at += step


def schedule_occurrences(
    schedule: Any, *, after: datetime, start_at: datetime | None = None, end_at: datetime | None = None
) -> Iterator[datetime]:
    """The occurrences of a stored schedule (its cron in its zone, or its interval from its anchor:
    `startAt` as given, else its creation to the second) strictly after `after`."""
    if schedule.every_s:
        anchor = schedule.start_at or schedule.created_at.replace(microsecond=0)
        return interval_occurrences(schedule.every_s, anchor, after=after, start_at=start_at, end_at=end_at)
    return occurrences(
        schedule.cron,
        schedule.timezone,
        after=after,
        start_at=start_at,
        end_at=end_at,
        dst_skipped=schedule.dst_skipped,
        dst_repeated=schedule.dst_repeated,
    )


def next_schedule_occurrences(
    schedule: Any, *, after: datetime, count: int, start_at: datetime | None = None, end_at: datetime | None = None
) -> list[datetime]:
    return list(islice(schedule_occurrences(schedule, after=after, start_at=start_at, end_at=end_at), count))


# A duration as the schedule fields take it (`every`, `catchupWindow`): a whole number of
# seconds, minutes, hours or days.
_DURATION = re.compile(r"([0-9]{1,7})([smhd])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any, name: str, *, maximum_s: int) -> int:
    """`90s`, `15m`, `6h`, `30d` in seconds, at most `maximum_s`; ValueError saying why not."""
    found = _DURATION.match(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError(f"{name} is a whole number of s, m, h or d, for example 90s, 15m, 6h or 30d.")
    seconds = int(found.group(1)) * _UNIT_SECONDS[found.group(2)]
    if seconds > maximum_s:
        raise ValueError(f"{name} is at most {duration_text(maximum_s)}.")
    return seconds


def duration_text(seconds: int) -> str:
    """A duration in the largest unit that says it exactly: 60 -> 1m, 90 -> 90s, 86400 -> 1d."""
    for unit in ("d", "h", "m"):
        if seconds and seconds % _UNIT_SECONDS[unit] == 0:
            return f"{seconds // _UNIT_SECONDS[unit]}{unit}"
    return f"{seconds}s"


def next_transition(zone: str, *, after: datetime) -> tuple[datetime, str] | None:
    """The zone's next change of UTC offset after `after` within a year, and its kind
    (`springForward`: a local hour is skipped; `fallBack`: one is repeated); None if none."""
    tz = ZoneInfo(zone)

    def offset(at: datetime) -> timedelta:
        return at.astimezone(tz).utcoffset() or timedelta(0)

    day = timedelta(days=1)
    start = after
    for _ in range(366):
        if offset(start + day) != offset(start):
            low, high = start, start + day
            while high - low > timedelta(minutes=1):
                middle = low + (high - low) / 2
                low, high = (middle, high) if offset(middle) == offset(low) else (low, middle)
            at = high.replace(second=0, microsecond=0)
            return at, "springForward" if offset(high) > offset(low) else "fallBack"
        start += day
    return None


def dst_preview(
    cron: str, zone: str, *, after: datetime, start_at: datetime | None = None, end_at: datetime | None = None
) -> dict[str, Any] | None:
    """What each DST choice does on the zone's next transition (docs/schedules.md, "Daylight
    saving time"): the cron's runs within a day of it under each choice of its kind; None when
    the zone has none within a year or the choices make no difference there."""
    found = next_transition(zone, after=after)
    if found is None:
        return None
    at, kind = found
    name, choices = ("dstSkipped", DST_SKIPPED) if kind == "springForward" else ("dstRepeated", DST_REPEATED)
    runs = {}
    for choice in choices:
        within = occurrences(
            cron,
            zone,
            after=max(after, at - timedelta(days=1)),
            start_at=start_at,
            end_at=min(at + timedelta(days=1), end_at) if end_at else at + timedelta(days=1),
            **{"dst_skipped" if name == "dstSkipped" else "dst_repeated": choice},
        )
        runs[choice] = [{"at": iso_ms(run), "local": local_iso(run, zone)} for run in within]
    if len({tuple(r["at"] for r in found_runs) for found_runs in runs.values()}) == 1:
        return None
    return {"at": iso_ms(at), "kind": kind, "choice": name, "runs": runs}
