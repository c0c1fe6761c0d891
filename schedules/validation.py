"""Validation of a schedule, shared by every edge (API, pages, admin, commands).

Errors are named by the wire fields (camelCase, dotted for nested ones), every mistake at once,
nothing stored. The request, the tags and the retry policy are checked by the same rules as a
call's (orchestration.validation.validate_submission), so a schedule can never make a call
that a submission would have refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from core.errors import ValidationFailed
from core.ids import utcnow
from core.text import name_problem
from orchestration.models import OVERLAP_POLICIES
from orchestration.retries import RetryPolicy
from orchestration.validation import json_value_error, one_year_after, validate_submission
from schedules.cron import (  # noqa: F401 (duration_text: re-exported for the pages)
    DST_REPEATED,
    DST_SKIPPED,
    MAX_EVERY_S,
    MIN_EVERY_S,
    CronError,
    duration_text,
    next_occurrences,
    parse_cron,
    parse_duration,
    parse_zone,
    runs_soon,
)

FIELDS = (
    "name",
    "cron",
    "every",
    "timezone",
    "requestSpec",
    "tags",
    "retryPolicy",
    "startAt",
    "endAt",
    "paused",
    "pausedNote",
    "catchupWindow",
    "jitterMs",
    "dstSkipped",
    "dstRepeated",
    "overlap",
)
MAX_JITTER_MS = 3_600_000
MAX_PAUSED_NOTE = 500
DEFAULT_CATCHUP_WINDOW_S = 60
MIN_CATCHUP_WINDOW_S = 60
MAX_CATCHUP_WINDOW_S = 30 * 86400
# The parts a call is made of, checked as a submission's.
_CALL_FIELDS = ("name", "requestSpec", "tags", "retryPolicy")
# Stand-ins for what a partial update leaves out, so that the submission check runs; their
# errors cannot arise, and only the given fields' errors are reported anyway.
_PLACEHOLDERS = {"name": "schedule", "requestSpec": {"method": "GET", "url": "https://example.com/"}}
_UNSHOWABLE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
MAX_INSTANT = 64


@dataclass(frozen=True)
class ScheduleInput:
    """A checked create or update. `given` holds the wire fields present: an absent field is
    left as it is by an update, while a given null clears what may be cleared (startAt,
    endAt, retryPolicy)."""

    given: frozenset[str]
    name: str | None = None
    cron: str | None = None
    timezone: str | None = None
    # {method, url, headers (plaintext), body, timeoutMs}; sealed by the service.
    request_spec: dict[str, Any] | None = None
    tags: list[str] | None = None
    retry_policy: RetryPolicy | None = None
    start_at: datetime | None = None
    end_at: datetime | None = None
    paused: bool | None = None
    paused_note: str | None = None
    catchup_window_s: int | None = None
    jitter_ms: int | None = None
    every_s: int | None = None
    dst_skipped: str | None = None
    dst_repeated: str | None = None
    overlap: str | None = None


class _Errors:
    def __init__(self) -> None:
        self.errors: dict[str, list[str]] = {}

    def add(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)


def parse_instant(value: Any, name: str) -> datetime | None:
    """An ISO 8601 date-time with a zone, in UTC; None for null. ValueError with a message."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_INSTANT:
        raise ValueError(f"{name} must be an ISO 8601 date-time with a time zone.")
    text = value.strip()
    try:
        parsed = parse_datetime(text[:-1] + "Z" if text.endswith("z") else text)
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValueError(f"{name} is not a valid ISO 8601 date-time (for example 2030-01-31T09:30:00Z).")
    if parsed.tzinfo is None:
        raise ValueError(f"{name} must carry a time zone (for example 'Z' or '+02:00').")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{name} is out of range.") from None


def validate_schedule(data: Any, *, partial: bool = False, now: datetime | None = None) -> ScheduleInput:
    """A create (`partial=False`: name, cron and requestSpec required) or an update (any of
    the fields). The combination of cron, zone and window of a create is checked here; an
    update's, merged with the stored schedule, by the service (check_plan)."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["The request body must be a JSON object."]})
    now = now or utcnow()
    errors = _Errors()
    unknown = [key for key in data if key not in FIELDS]
    if unknown:
        shown = ", ".join(sorted(_UNSHOWABLE.sub("\ufffd", str(key)) for key in unknown))
        errors.add("body", f"Unknown fields: {shown}.")

    call_parts = {key: data[key] for key in _CALL_FIELDS if key in data}
    submission = None
    if call_parts or not partial:
        probe = {**({} if not partial else _PLACEHOLDERS), **call_parts}
        if "retryPolicy" in probe and probe["retryPolicy"] is None:
            del probe["retryPolicy"]
        try:
            submission = validate_submission(probe)
        except ValidationFailed as exc:
            for name, messages in exc.errors.items():
                if not partial or name.split(".")[0] in call_parts:
                    for message in messages:
                        errors.add(name, message)

    cron = every_s = None
    if data.get("every") is not None:
        if data.get("cron") is not None:
            errors.add("every", "Give a cron or an interval (every), not both.")
        try:
            every_s = parse_duration(data["every"], "every", maximum_s=MAX_EVERY_S)
            if every_s < MIN_EVERY_S:
                errors.add("every", "every is at least 1 minute (60s).")
        except ValueError as exc:
            errors.add("every", str(exc))
    elif "cron" in data or not partial:
        try:
            cron = parse_cron(data.get("cron"))
        except CronError as exc:
            errors.add("cron", str(exc) + " (or give an interval: every, e.g. 15m)")

    zone = None
    if "timezone" in data or not partial:
        try:
            zone = parse_zone(data.get("timezone"))
        except CronError as exc:
            errors.add("timezone", str(exc))

    start_at = end_at = None
    for name in ("startAt", "endAt"):
        if name not in data:
            continue
        if (problem := json_value_error(data[name], where=name)) is not None:
            errors.add(name, problem)
            continue
        try:
            value = parse_instant(data[name], name)
        except ValueError as exc:
            errors.add(name, str(exc))
            continue
        if name == "startAt":
            if value is not None and value > one_year_after(now):
                errors.add(name, "startAt must be at most one year ahead.")
            start_at = value
        else:
            if value is not None and value <= now:
                errors.add(name, "endAt must be in the future.")
            end_at = value
    if start_at is not None and end_at is not None and end_at <= start_at:
        errors.add("endAt", "endAt must be after startAt.")

    paused = data.get("paused")
    if "paused" in data and not isinstance(paused, bool):
        errors.add("paused", "paused is true or false.")

    paused_note = data.get("pausedNote")
    if paused_note is None:
        paused_note = ""
    elif not isinstance(paused_note, str):
        errors.add("pausedNote", "pausedNote is a string (or null: no note).")
    elif len(paused_note) > MAX_PAUSED_NOTE:
        errors.add("pausedNote", f"pausedNote is at most {MAX_PAUSED_NOTE} characters.")
    elif (problem := json_value_error(paused_note, where="pausedNote")) or (problem := name_problem(paused_note)):
        errors.add("pausedNote", problem.replace("The name", "pausedNote"))

    jitter_ms = data.get("jitterMs")
    if "jitterMs" in data and (
        isinstance(jitter_ms, bool) or not isinstance(jitter_ms, int) or not 0 <= jitter_ms <= MAX_JITTER_MS
    ):
        errors.add("jitterMs", f"jitterMs is an integer from 0 to {MAX_JITTER_MS} (one hour).")

    for name, allowed in (("dstSkipped", DST_SKIPPED), ("dstRepeated", DST_REPEATED), ("overlap", OVERLAP_POLICIES)):
        if name in data and data[name] not in allowed:
            errors.add(name, f"{name} is one of {', '.join(allowed)}.")

    if not partial and isinstance(paused_note, str) and paused_note.strip() and paused is not True:
        errors.add("pausedNote", "A note says why a schedule is paused: give paused: true too.")

    catchup_window_s = None
    if "catchupWindow" in data:
        try:
            catchup_window_s = parse_duration(data["catchupWindow"], "catchupWindow", maximum_s=MAX_CATCHUP_WINDOW_S)
            if catchup_window_s < MIN_CATCHUP_WINDOW_S:
                # Shorter, a call the timer is about to start (a moment late) would count as missed.
                errors.add("catchupWindow", "catchupWindow is at least 1m.")
        except ValueError as exc:
            errors.add("catchupWindow", str(exc))

    if not partial and not errors.errors and cron is not None and zone is not None:
        _plan_problems(cron, zone, start_at, end_at, now, errors)
    if errors.errors:
        raise ValidationFailed(errors.errors)

    given = frozenset(key for key in FIELDS if key in data)
    request_spec = None
    if submission is not None and "requestSpec" in given:
        request_spec = {
            "method": submission.method,
            "url": submission.url,
            "headers": submission.headers,
            "body": submission.body,
            "timeoutMs": submission.timeout_ms,
            **({"connection": submission.connection} if submission.connection else {}),
        }
    return ScheduleInput(
        given=given,
        name=submission.name if submission is not None and "name" in given else None,
        cron=cron,
        timezone=zone,
        request_spec=request_spec,
        tags=submission.tags if submission is not None and "tags" in given else None,
        retry_policy=submission.retry_policy if submission is not None and "retryPolicy" in given else None,
        start_at=start_at,
        end_at=end_at,
        paused=paused if "paused" in given else None,
        paused_note=paused_note.strip() if "pausedNote" in given else None,
        catchup_window_s=catchup_window_s,
        jitter_ms=jitter_ms if "jitterMs" in given else None,
        every_s=every_s,
        dst_skipped=data.get("dstSkipped") if "dstSkipped" in given else None,
        dst_repeated=data.get("dstRepeated") if "dstRepeated" in given else None,
        overlap=data.get("overlap") if "overlap" in given else None,
    )


def _plan_problems(
    cron: str, zone: str, start_at: datetime | None, end_at: datetime | None, now: datetime, errors: _Errors
) -> None:
    if not runs_soon(cron, zone, now=max(now, start_at or now)):
        errors.add("cron", "cron matches no date within five years (for example 30 February never comes).")
        return
    if end_at is not None and not next_occurrences(cron, zone, after=now, count=1, start_at=start_at, end_at=end_at):
        errors.add("endAt", "No occurrence of the cron falls between startAt (or now) and endAt.")


def check_plan(
    *, cron: str, zone: str, start_at: datetime | None, end_at: datetime | None, now: datetime | None = None
) -> None:
    """The whole schedule as it would stand (an update merged with the stored one): the cron
    runs within five years, the window holds an occurrence and ends after it starts."""
    now = now or utcnow()
    errors = _Errors()
    if start_at is not None and end_at is not None and end_at <= start_at:
        errors.add("endAt", "endAt must be after startAt.")
    else:
        _plan_problems(cron, zone, start_at, end_at, now, errors)
    if errors.errors:
        raise ValidationFailed(errors.errors)


def validate_preview(
    cron: Any, zone: Any, dst_skipped: Any = None, dst_repeated: Any = None
) -> tuple[str, str, dict[str, str]]:
    """The preview's query: a cron and a zone (absent: UTC), checked as a schedule's, and the DST
    choices (absent: the defaults), as occurrences() takes them."""
    errors = _Errors()
    parsed_cron = parsed_zone = None
    try:
        parsed_cron = parse_cron(cron)
    except CronError as exc:
        errors.add("cron", str(exc))
    try:
        parsed_zone = parse_zone(zone or None)
    except CronError as exc:
        errors.add("timezone", str(exc))
    choices = {"dst_skipped": dst_skipped or "afterJump", "dst_repeated": dst_repeated or "once"}
    for name, key, allowed in (
        ("dstSkipped", "dst_skipped", DST_SKIPPED),
        ("dstRepeated", "dst_repeated", DST_REPEATED),
    ):
        if choices[key] not in allowed:
            errors.add(name, f"{name} is one of {', '.join(allowed)}.")
    if parsed_cron is not None and parsed_zone is not None:
        _plan_problems(parsed_cron, parsed_zone, None, None, utcnow(), errors)
    if errors.errors:
        raise ValidationFailed(errors.errors)
    return parsed_cron, parsed_zone, choices  # type: ignore[return-value]


BACKFILL_MAX = 1000


# The earliest a backfill reaches back to.
EARLIEST_BACKFILL = datetime(1970, 1, 1, tzinfo=UTC)


def validate_backfill(data: Any, *, now: datetime | None = None) -> tuple[datetime, datetime, str | None]:
    """A backfill's `{from, to, overlap?}`: two instants, `from` before `to`, `to` not in the
    future (the occurrences to make are past ones; how many, at most BACKFILL_MAX, is counted by
    the service), and the overlap policy its calls take instead of the schedule's (None: the
    schedule's). ValidationFailed naming each bad field."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ['A JSON object is required: {"from": "...", "to": "..."}.']})
    now = now or utcnow()
    errors = _Errors()
    for name in sorted(set(data) - {"from", "to", "overlap"}):
        errors.add(name, "Unknown field.")
    overlap = data.get("overlap")
    if overlap is not None and overlap not in OVERLAP_POLICIES:
        errors.add("overlap", f"overlap is one of {', '.join(OVERLAP_POLICIES)} (or absent: the schedule's).")
    found: dict[str, datetime] = {}
    for name in ("from", "to"):
        if data.get(name) is None:
            errors.add(name, f"{name} is required: an ISO 8601 date-time with a time zone.")
            continue
        if (problem := json_value_error(data[name], where=name)) is not None:
            errors.add(name, problem)
            continue
        try:
            found[name] = parse_instant(data[name], name)  # type: ignore[assignment]
        except ValueError as exc:
            errors.add(name, str(exc))
    if "from" in found and found["from"] < EARLIEST_BACKFILL:
        # Occurrences are computed in the schedule's zone: near year 1 the arithmetic overflows.
        errors.add("from", f"from must be {EARLIEST_BACKFILL.year} or later.")
    if "to" in found and found["to"] > now:
        errors.add("to", "to must not be in the future: a backfill makes past occurrences.")
    if "from" in found and "to" in found and found["from"] >= found["to"]:
        errors.add("to", "to must be after from.")
    if errors.errors:
        raise ValidationFailed(errors.errors)
    return found["from"], found["to"], overlap
