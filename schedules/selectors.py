"""Reads of schedules and of the calls they made (API, pages, admin, commands, the loop)."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now

from core.errors import NotFound
from core.ids import utcnow
from orchestration.models import ServiceCall
from orchestration.selectors import service_calls_for_tenant
from schedules.models import Schedule

RECENT_CALLS = 20


def _uuid(raw: uuid.UUID | str) -> uuid.UUID | None:
    if isinstance(raw, uuid.UUID):
        return raw
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        return None


def schedules_for_tenant(*, tenant_id: str) -> QuerySet[Schedule]:
    """A tenant's schedules, newest first (UUID v7 order; uses schedules_tenant), each with the
    occurrences its overlap policy skipped (`overlap_skipped`, for skipped_of)."""
    return with_last_occurrence(
        with_overlap_skipped(Schedule.objects.filter(tenant_id=tenant_id).order_by("-schedule_id"))
    )


def _overlap_skipped_calls() -> QuerySet[ServiceCall]:
    # service_calls_overlap_skipped: an index probe a schedule.
    return ServiceCall.objects.filter(overlap_state=ServiceCall.OverlapState.SKIPPED)


def with_last_occurrence(rows: QuerySet[Schedule]) -> QuerySet[Schedule]:
    """The schedules, each with its latest occurrence that has come and has its call
    (`last_come`, for last_occurrence_of): an index probe of service_calls_schedule_occurrence."""
    latest = (
        ServiceCall.objects.filter(
            tenant_id=OuterRef("tenant_id"), schedule_id=OuterRef("pk"), occurrence_at__lte=Now()
        )
        .exclude(status=ServiceCall.Status.CANCELLED)
        .order_by("-occurrence_at")
        .values("occurrence_at")[:1]
    )
    return rows.annotate(last_come=Subquery(latest))


def last_occurrence_of(schedule: Schedule) -> datetime | None:
    """Its latest occurrence that has come (not the one made ahead, which is its next run), or
    None: what the API's lastOccurrenceAt says."""
    if hasattr(schedule, "last_come"):
        return schedule.last_come
    return (
        ServiceCall.objects.filter(tenant_id=schedule.tenant_id, schedule_id=schedule.pk, occurrence_at__lte=utcnow())
        .exclude(status=ServiceCall.Status.CANCELLED)
        .order_by("-occurrence_at")
        .values_list("occurrence_at", flat=True)
        .first()
    )


def with_overlap_skipped(rows: QuerySet[Schedule]) -> QuerySet[Schedule]:
    """The schedules, each with how many of its occurrences its overlap policy skipped: the
    calls say it (orchestration decides an overlap and marks the call skipped), so it is
    counted from them rather than written on the schedule by the start of a call."""
    count = (
        _overlap_skipped_calls()
        .filter(tenant_id=OuterRef("tenant_id"), schedule_id=OuterRef("pk"))
        .values("schedule_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return rows.annotate(overlap_skipped=Coalesce(Subquery(count), 0))


def skipped_of(schedule: Schedule) -> tuple[int, dict[str, int]]:
    """Its skipped occurrences, in all and by reason (docs/schedules.md, "Missed occurrences" and "Overlap"):
    those the loop counted (catch-up window, DST) and those its overlap policy skipped."""
    overlap = getattr(schedule, "overlap_skipped", None)
    if overlap is None:
        overlap = _overlap_skipped_calls().filter(tenant_id=schedule.tenant_id, schedule_id=schedule.pk).count()
    reasons = dict(schedule.skipped_reasons or {})
    if overlap:
        reasons["overlap"] = overlap
    return schedule.skipped_count + overlap, reasons


def schedule_get(*, tenant_id: str, schedule_id: uuid.UUID | str) -> Schedule:
    """One of the tenant's schedules; NotFound for anything else (a malformed id too)."""
    pk = _uuid(schedule_id)
    schedule = schedules_for_tenant(tenant_id=tenant_id).filter(pk=pk).first() if pk else None
    if schedule is None:
        raise NotFound(f"Schedule {schedule_id} not found.")
    return schedule


def schedule_calls(*, schedule: Schedule, limit: int = RECENT_CALLS) -> list[ServiceCall]:
    """Its calls, latest occurrence first, tags prefetched (service_calls_schedule_occurrence)."""
    return list(
        service_calls_for_tenant(tenant_id=schedule.tenant_id)
        .filter(schedule_id=schedule.schedule_id)
        .order_by("-occurrence_at")[:limit]
    )


def waiting_calls(*, tenant_id: str, schedule_id: uuid.UUID, lock: bool = False) -> list[ServiceCall]:
    """Its calls that have not started yet (Scheduled, no attempt): normally the one call
    made ahead. A call waiting for a retry has started, so it is not one of them. With `lock`
    (inside a transaction) their rows are held until commit, so none starts (and fails into a
    retry) between this look and a cancel."""
    rows = ServiceCall.objects.filter(
        tenant_id=tenant_id, schedule_id=schedule_id, status=ServiceCall.Status.SCHEDULED, attempts=0
    )
    if lock:
        rows = rows.select_for_update()
    return list(rows.only("service_call_id", "tenant_id", "occurrence_at", "status", "attempts"))


def occurrence_call(
    *, tenant_id: str, schedule_id: uuid.UUID, occurrence_at: datetime, lock: bool = False
) -> ServiceCall | None:
    """The call made for one occurrence, if any. With `lock` (inside a transaction) its row is
    held until commit, so the timer's start (which skips locked rows) cannot move it between
    the loop's look and its cancel."""
    rows = ServiceCall.objects.filter(tenant_id=tenant_id, schedule_id=schedule_id, occurrence_at=occurrence_at)
    if lock:
        rows = rows.select_for_update()
    return rows.only(
        "service_call_id", "tenant_id", "status", "attempts", "started_at", "due_at", "occurrence_at"
    ).first()


def schedules_next_advance(*, exclude: Collection[uuid.UUID] = ()) -> datetime | None:
    """When the next schedule's call made ahead comes due (its advance_at), of those not in
    `exclude`: how long the schedules loop may sleep (schedules_advance)."""
    rows = Schedule.objects.filter(advance_at__isnull=False)
    if exclude:
        rows = rows.exclude(pk__in=list(exclude))
    return rows.order_by("advance_at").values_list("advance_at", flat=True).first()


def schedules_using_connection(tenant_id: str, name: str, *, limit: int = 5) -> list[str]:
    """The tenant's schedules whose calls name the connection, a few, for a refused delete
    (execution.connections.connection_delete)."""
    found = (
        Schedule.objects.filter(tenant_id=tenant_id, request_spec__connection=name)
        .order_by("schedule_id")
        .values_list("name", "schedule_id")[:limit]
    )
    return [f"schedule {schedule_name!r} ({pk})" for schedule_name, pk in found]


def skipped_occurrences_by_reason() -> dict[str, int]:
    """Every schedule's skipped occurrences, by reason (the /metrics counter): one row a
    schedule, a tenant having at most MAX_SCHEDULES_PER_TENANT."""
    totals: dict[str, int] = {"catchupWindow": 0, "dstSkipped": 0}
    for reasons in Schedule.objects.exclude(skipped_count=0).values_list("skipped_reasons", flat=True):
        for reason, count in (reasons or {}).items():
            totals[reason] = totals.get(reason, 0) + int(count)
    # Of the schedules that exist, as the loop's counts: a deleted schedule takes its own along.
    totals["overlap"] = _overlap_skipped_calls().filter(schedule_id__in=Schedule.objects.values("pk")).count()
    return totals
