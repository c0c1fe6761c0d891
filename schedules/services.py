"""Writes of schedules, and the loop that makes their occurrences into service calls
(docs/schedules.md). The only code that writes the `schedules` table; calls are made and
cancelled through orchestration's services, never written here.

The calls of the occurrences are made and cancelled by schedules.making, the loop that advances
the schedules is schedules.materialize.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from core.errors import NotFound, ValidationFailed
from core.ids import new_id, utcnow
from core.secrets import SecretUnavailable, is_sealed, rotate_sealed, seal_headers
from execution.connections import connection_check
from orchestration.models import ServiceCall
from orchestration.services import (
    RotationResult,
    retry_policy_within_ceilings,
)
from schedules.cron import interval_occurrences, schedule_occurrences
from schedules.making import cancel_waiting, make_occurrence_call, replan
from schedules.models import Schedule
from schedules.selectors import schedule_get, waiting_calls
from schedules.validation import BACKFILL_MAX, DEFAULT_CATCHUP_WINDOW_S, ScheduleInput, check_plan
from tenants.models import Tenant

logger = logging.getLogger("serviceagent.schedules")


# --- A tenant's schedules ---------------------------------------------------------------------


def _spec_sealed(spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "headers": seal_headers(spec.get("headers") or {})}


def _check_connection(tenant_id: str, spec: dict[str, Any] | None) -> None:
    """The connection the schedule's calls will carry exists, and the request leaves its header
    alone (docs/connections.md)."""
    spec = spec or {}
    connection_check(
        tenant_id=tenant_id,
        name=spec.get("connection"),
        header_names=spec.get("headers") or {},
        field="requestSpec.connection",
    )


def _plan_of(schedule: Schedule) -> tuple:
    """What decides the schedule's occurrences: a change of any of it plans the schedule again."""
    return (
        schedule.cron,
        schedule.every_s,
        schedule.timezone,
        schedule.start_at,
        schedule.end_at,
        schedule.dst_skipped,
        schedule.dst_repeated,
    )


def _locked(tenant_id: str, schedule_id: uuid.UUID | str) -> Schedule:
    try:
        pk = schedule_id if isinstance(schedule_id, uuid.UUID) else uuid.UUID(str(schedule_id))
    except ValueError:
        raise NotFound(f"Schedule {schedule_id} not found.") from None
    schedule = Schedule.objects.select_for_update().filter(tenant_id=tenant_id, pk=pk).first()
    if schedule is None:
        raise NotFound(f"Schedule {schedule_id} not found.")
    return schedule


def schedule_create(
    *, tenant_id: str, data: ScheduleInput, correlation_id: str | None = None, now: datetime | None = None
) -> Schedule:
    """Store a schedule (checked by validate_schedule) and make its first call at once, in the
    same transaction, unless it is paused. A tenant has at most MAX_SCHEDULES_PER_TENANT, and
    its retry policy keeps within the tenant's ceilings (docs/retries.md, "Operator ceilings")."""
    now = now or utcnow()
    if data.retry_policy is not None:
        retry_policy_within_ceilings(tenant_id=tenant_id, policy=data.retry_policy)
    _check_connection(tenant_id, data.request_spec)
    if data.every_s and data.end_at is not None:
        # As for a cron (validation's plan check): the window must hold an occurrence.
        anchor = data.start_at or now.replace(microsecond=0)
        first = next(interval_occurrences(data.every_s, anchor, after=now, start_at=data.start_at), None)
        if first is None or first > data.end_at:
            raise ValidationFailed(
                {"endAt": ["No occurrence of the interval falls between startAt (or now) and endAt."]}
            )
    with transaction.atomic():
        # The tenant's row, locked: two creates never both take the last place.
        list(Tenant.objects.select_for_update().filter(pk=tenant_id).values_list("pk", flat=True))
        limit = settings.MAX_SCHEDULES_PER_TENANT
        if Schedule.objects.filter(tenant_id=tenant_id).count() >= limit:
            raise ValidationFailed(
                {"body": [f"A tenant may have at most {limit} schedules (MAX_SCHEDULES_PER_TENANT)."]}
            )
        schedule = Schedule.objects.create(
            schedule_id=new_id(),
            tenant_id=tenant_id,
            name=data.name,
            cron=data.cron or "",
            every_s=data.every_s,
            timezone=data.timezone or "UTC",
            dst_skipped=data.dst_skipped or "afterJump",
            dst_repeated=data.dst_repeated or "once",
            overlap=data.overlap or "skip",
            request_spec=_spec_sealed(data.request_spec or {}),
            tags=list(data.tags or []),
            retry_policy=data.retry_policy.as_wire() if data.retry_policy else None,
            start_at=data.start_at,
            end_at=data.end_at,
            paused=bool(data.paused),
            paused_note=(data.paused_note or "") if data.paused else "",
            catchup_window_s=data.catchup_window_s if data.catchup_window_s is not None else DEFAULT_CATCHUP_WINDOW_S,
            jitter_ms=data.jitter_ms or 0,
            created_at=now,
            updated_at=now,
        )
        replan(schedule, now=now, correlation_id=correlation_id, call_changed=True)
        schedule.save(update_fields=["last_occurrence_at", "advance_at"])
    return schedule


def schedule_update(
    *,
    tenant_id: str,
    schedule_id: uuid.UUID | str,
    data: ScheduleInput,
    correlation_id: str | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Change what `data` gives (validate_schedule(partial=True)). Pausing cancels the call
    made ahead; resuming, or a new cron, zone, start, end, request, tags or retry policy,
    plans the schedule from now again (_replan). A new name shows on the calls made after."""
    now = now or utcnow()
    given = data.given
    if "retryPolicy" in given and data.retry_policy is not None:
        retry_policy_within_ceilings(tenant_id=tenant_id, policy=data.retry_policy)
    if "requestSpec" in given:
        _check_connection(tenant_id, data.request_spec)
    with transaction.atomic():
        schedule = _locked(tenant_id, schedule_id)
        was_paused = schedule.paused
        before = _plan_of(schedule)
        calls_before = (schedule.tags, schedule.retry_policy, schedule.overlap)
        if "name" in given:
            schedule.name = data.name
        if "cron" in given and data.cron:
            schedule.cron, schedule.every_s = data.cron, None
        if "every" in given and data.every_s:
            schedule.cron, schedule.every_s = "", data.every_s
        if "timezone" in given:
            schedule.timezone = data.timezone or "UTC"
        if "startAt" in given:
            schedule.start_at = data.start_at
        if "endAt" in given:
            schedule.end_at = data.end_at
        if "requestSpec" in given:
            schedule.request_spec = _spec_sealed(data.request_spec or {})
        if "tags" in given:
            schedule.tags = list(data.tags or [])
        if "retryPolicy" in given:
            schedule.retry_policy = data.retry_policy.as_wire() if data.retry_policy else None
        if "paused" in given:
            schedule.paused = bool(data.paused)
        if "pausedNote" in given:
            if data.paused_note and not schedule.paused:
                raise ValidationFailed({"pausedNote": ["A note says why a schedule is paused: pause it too."]})
            schedule.paused_note = data.paused_note or ""
        if not schedule.paused:  # a note says why it is paused: a resume clears it
            schedule.paused_note = ""
        if "catchupWindow" in given:
            schedule.catchup_window_s = data.catchup_window_s
        if "jitterMs" in given:
            schedule.jitter_ms = data.jitter_ms
        if "dstSkipped" in given:
            schedule.dst_skipped = data.dst_skipped
        if "dstRepeated" in given:
            schedule.dst_repeated = data.dst_repeated
        if "overlap" in given:
            schedule.overlap = data.overlap
        time_changed = _plan_of(schedule) != before
        if time_changed and schedule.cron:
            check_plan(
                cron=schedule.cron, zone=schedule.timezone, start_at=schedule.start_at, end_at=schedule.end_at, now=now
            )
        call_changed = (
            "requestSpec" in given
            or "jitterMs" in given
            or (schedule.tags, schedule.retry_policy, schedule.overlap) != calls_before
        )
        if schedule.paused != was_paused or time_changed or call_changed:
            replan(schedule, now=now, correlation_id=correlation_id, call_changed=call_changed)
        schedule.updated_at = now
        schedule.revision += 1
        schedule.save()
    return schedule


def schedule_set_paused(
    *,
    tenant_id: str,
    schedule_id: uuid.UUID | str,
    paused: bool,
    correlation_id: str | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Pause (nothing more runs: the call made ahead is cancelled) or resume (planned from now;
    a pause's note goes)."""
    return schedule_update(
        tenant_id=tenant_id,
        schedule_id=schedule_id,
        data=ScheduleInput(given=frozenset({"paused"}), paused=paused),
        correlation_id=correlation_id,
        now=now,
    )


def schedule_delete(*, tenant_id: str, schedule_id: uuid.UUID | str, correlation_id: str | None = None) -> None:
    """Delete it: the call made ahead is cancelled, no occurrence follows; the calls it made stay."""
    with transaction.atomic():
        schedule = _locked(tenant_id, schedule_id)
        cancel_waiting(
            waiting_calls(tenant_id=tenant_id, schedule_id=schedule.schedule_id, lock=True),
            correlation_id,
        )
        schedule.delete()


def schedule_sealed_values_rotate(*, dry_run: bool = False) -> RotationResult:
    """Re-encrypt every sealed header value of every schedule under the first key (each row a
    conditional update on its old spec). A row sealed under a key no longer configured is
    reported in `failed` and left as it is."""
    result = RotationResult(failed=[])
    for schedule_id, spec in Schedule.objects.order_by("schedule_id").values_list("schedule_id", "request_spec"):
        result.examined += 1
        headers = (spec or {}).get("headers") or {}
        if not any(is_sealed(value) for value in headers.values()):
            continue
        try:
            rotated = rotate_sealed(headers)
        except SecretUnavailable:
            result.failed.append(str(schedule_id))  # type: ignore[union-attr]
            continue
        if rotated == headers:
            continue
        result.rotated += 1
        if dry_run:
            continue
        with transaction.atomic():
            current = Schedule.objects.select_for_update().filter(pk=schedule_id).values_list("request_spec", flat=True)
            if list(current) == [spec]:  # unchanged meanwhile (else its new headers are sealed anew)
                Schedule.objects.filter(pk=schedule_id).update(request_spec={**spec, "headers": rotated})
    return result


@dataclass
class Backfill:
    """A backfill's calls, one per occurrence of the range, in order: `made` now, or the live
    call the occurrence already had (a backfill asked again makes nothing twice)."""

    made: list[ServiceCall] = field(default_factory=list)
    existing: list[ServiceCall] = field(default_factory=list)


def backfill_plan(*, tenant_id: str, schedule_id: uuid.UUID | str, start: datetime, end: datetime) -> list[datetime]:
    """The occurrences of the schedule's cron in [start, end], at most BACKFILL_MAX (more: a 400
    naming `to`); NotFound for another tenant's schedule."""
    schedule = schedule_get(tenant_id=tenant_id, schedule_id=schedule_id)
    instants = []
    for at in schedule_occurrences(schedule, after=start - timedelta(microseconds=1), end_at=end):
        instants.append(at)
        if len(instants) > BACKFILL_MAX:
            raise ValidationFailed(
                {"to": [f"More than {BACKFILL_MAX} occurrences fall in the range: narrow it; nothing was made."]}
            )
    return instants


def schedule_backfill(
    *, tenant_id: str, schedule_id: uuid.UUID | str, instants: list[datetime], overlap: str | None = None
) -> Backfill:
    """Make a call for each occurrence of `instants` (backfill_plan) that has no live call (one
    that was skipped or cancelled gets a new one), due at once, in occurrence order, under the
    schedule's overlap policy or `overlap`; an occurrence that has its live call keeps it, so a
    backfill asked again makes nothing twice (docs/schedules.md, "Backfill")."""
    result = Backfill()
    with transaction.atomic():
        schedule = _locked(tenant_id, schedule_id)
        for at in instants:
            call, created = make_occurrence_call(schedule, at, at_once=True, overlap=overlap)
            (result.made if created else result.existing).append(call)
    return result
