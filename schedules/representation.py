"""The wire representation of a schedule: one builder for the API, the pages and the commands
(`list_schedules --json`). camelCase keys, instants in UTC with milliseconds and Z, each run
also as its zone shows it; secret header values redacted (docs/api.md, "Wire format")."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.urls import reverse

from core.ids import iso_ms, utcnow
from orchestration.models import ServiceCall
from orchestration.representation import service_call_representation
from orchestration.services import public_request_spec
from schedules.cron import dst_preview, jitter_of, local_iso, next_schedule_occurrences
from schedules.models import Schedule
from schedules.selectors import last_occurrence_of, skipped_of
from schedules.validation import duration_text

NEXT_RUNS = 5


class State:
    ACTIVE = "active"
    PAUSED = "paused"
    # No occurrence left (past its end): it makes no more calls.
    ENDED = "ended"


def run_representation(at: datetime, zone: str, *, due: datetime | None = None) -> dict[str, str]:
    """One occurrence: `at` in UTC, `local` in the schedule's zone with its offset, `zoneName`
    as the zone database names the zone then (`IST`, `CEST`: what every page shows, whatever a
    browser's locale would call it), and `dueAt` when its call is due later (a schedule's jitter)."""
    shown = {"at": iso_ms(at), "local": local_iso(at, zone), "zoneName": at.astimezone(ZoneInfo(zone)).tzname()}
    if due is not None and due != at:
        shown["dueAt"] = iso_ms(due)
    return shown


def schedule_run(schedule: Schedule, at: datetime) -> dict[str, str]:
    """One occurrence of `schedule` as the API shows it, with its call's due time."""
    return run_representation(at, schedule.timezone, due=at + jitter_of(schedule.schedule_id, at, schedule.jitter_ms))


def next_runs(schedule: Schedule, *, now: datetime | None = None, count: int = NEXT_RUNS) -> list[datetime]:
    """The occurrences that will run, from the call made ahead on (none while paused)."""
    if schedule.paused:
        return []
    now = now or utcnow()
    after = now
    if schedule.last_occurrence_at is not None and schedule.last_occurrence_at > now:
        # From the call made ahead: an occurrence before it is not going to make a call.
        after = schedule.last_occurrence_at - timedelta(microseconds=1)
    return next_schedule_occurrences(
        schedule, after=after, count=count, start_at=schedule.start_at, end_at=schedule.end_at
    )


def schedule_state(schedule: Schedule, runs: list[datetime]) -> str:
    if schedule.paused:
        return State.PAUSED
    return State.ACTIVE if runs else State.ENDED


def _url(request: Any, path: str, base_url: str | None) -> str:
    if request is not None:
        return request.build_absolute_uri(path)
    return base_url.rstrip("/") + path if base_url else path


def schedule_links(schedule: Schedule, *, request: Any = None, base_url: str | None = None) -> dict[str, str]:
    """With a request, absolute URLs built from it; without one, from `base_url` (a command:
    AGENT_BASE_URL); with neither, absolute paths."""
    path = reverse(
        "api:schedule-detail", kwargs={"tenant_id": schedule.tenant_id, "schedule_id": str(schedule.schedule_id)}
    )
    return {"self": _url(request, path, base_url)}


def schedule_representation(
    schedule: Schedule,
    *,
    request: Any = None,
    base_url: str | None = None,
    now: datetime | None = None,
    runs: list[datetime] | None = None,
) -> dict[str, Any]:
    """A schedule as the list shows it: its settings, its state and its next run."""
    if runs is None:
        runs = next_runs(schedule, now=now, count=1)
    skipped, by_reason = skipped_of(schedule)
    return {
        "scheduleId": str(schedule.schedule_id),
        "tenantId": schedule.tenant_id,
        "name": schedule.name,
        "cron": schedule.cron or None,
        "every": duration_text(schedule.every_s) if schedule.every_s else None,
        "timezone": schedule.timezone,
        "requestSpec": public_request_spec(schedule.request_spec),
        "tags": list(schedule.tags or []),
        "retryPolicy": schedule.retry_policy,
        "startAt": iso_ms(schedule.start_at),
        "endAt": iso_ms(schedule.end_at),
        "paused": schedule.paused,
        "pausedNote": schedule.paused_note or None,
        "catchupWindow": duration_text(schedule.catchup_window_s),
        "dstSkipped": schedule.dst_skipped,
        "dstRepeated": schedule.dst_repeated,
        "jitterMs": schedule.jitter_ms,
        "state": schedule_state(schedule, runs),
        "nextRun": schedule_run(schedule, runs[0]) if runs else None,
        "lastOccurrenceAt": iso_ms(last_occurrence_of(schedule)),
        "overlap": schedule.overlap,
        "skippedCount": skipped,
        "skippedByReason": by_reason,
        "createdAt": iso_ms(schedule.created_at),
        "updatedAt": iso_ms(schedule.updated_at),
        "links": schedule_links(schedule, request=request, base_url=base_url),
    }


def schedule_detail_representation(
    schedule: Schedule,
    *,
    calls: Iterable[ServiceCall],
    request: Any = None,
    base_url: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The schedule with `nextRuns` (the next five occurrences, in UTC and in its zone) and
    `recentCalls` (its latest calls, latest occurrence first: schedules.selectors.schedule_calls)."""
    runs = next_runs(schedule, now=now)
    return {
        **schedule_representation(schedule, request=request, base_url=base_url, runs=runs),
        "nextRuns": [schedule_run(schedule, at) for at in runs],
        # What each DST choice does on the zone's next transition (null: none, or no difference).
        "nextDstTransition": None
        if schedule.every_s
        else dst_preview(
            schedule.cron, schedule.timezone, after=now or utcnow(), start_at=schedule.start_at, end_at=schedule.end_at
        ),
        "recentCalls": [service_call_representation(call, request=request, base_url=base_url) for call in calls],
    }
