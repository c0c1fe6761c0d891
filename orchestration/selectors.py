"""Reads of service calls for the API, the dashboard, the admin and the workers."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Prefetch, QuerySet

from core.db import db_uuid, sql_query
from core.errors import NotFound
from orchestration.models import ServiceCall, ServiceCallTag


def service_calls_for_tenant(*, tenant_id: str) -> QuerySet[ServiceCall]:
    """A tenant's calls, newest submitted first (UUID v7 order), with tags prefetched."""
    return (
        ServiceCall.objects.filter(tenant_id=tenant_id)
        .order_by("-service_call_id")
        .prefetch_related(Prefetch("tag_rows", queryset=ServiceCallTag.objects.order_by("id")))
    )


def service_call_get(*, tenant_id: str, service_call_id: uuid.UUID | str) -> ServiceCall:
    try:
        uuid.UUID(str(service_call_id))
    except ValueError:
        raise NotFound(f"Service call {service_call_id} not found.") from None
    call = service_calls_for_tenant(tenant_id=tenant_id).filter(pk=service_call_id).first()
    if call is None:
        raise NotFound(f"Service call {service_call_id} not found.")
    return call


def tags_of(call: ServiceCall) -> list[str]:
    return [row.tag for row in call.tag_rows.all()]


def call_tags_by_call(tenant_ids: list[str], service_call_ids: list[uuid.UUID]) -> dict[uuid.UUID, set[str]]:
    """The tags the calls carry now, by call (the fan-out's filter by tag: docs/events.md); one
    query along service_call_tags_unique."""
    found: dict[uuid.UUID, set[str]] = {}
    rows = ServiceCallTag.objects.filter(tenant_id__in=tenant_ids, service_call_id__in=service_call_ids)
    for call_id, tag in rows.values_list("service_call_id", "tag"):
        found.setdefault(call_id, set()).add(tag)
    return found


def service_calls_running(*, started_before: datetime, limit: int = 500) -> list[ServiceCall]:
    """Running calls that started before a time (uses service_calls_running)."""
    return list(
        ServiceCall.objects.filter(status=ServiceCall.Status.RUNNING, started_at__lt=started_before)
        .only("service_call_id", "tenant_id", "started_at", "attempts")
        .order_by("started_at")[:limit]
    )


def status_counts(*, tenant_id: str | None = None) -> dict[str, Any]:
    from django.db.models import Count

    qs = ServiceCall.objects.all()
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    counts = dict(qs.values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
    return {status: counts.get(status, 0) for status in ServiceCall.Status.values}


def startable_due(due_before: datetime) -> QuerySet[ServiceCall]:
    """Scheduled calls that flow control does not hold, due at or before a time: the condition
    of the partial index service_calls_startable_due, written once (the workers' backlog, its
    start, the watchdog's overdue sweep)."""
    return ServiceCall.objects.filter(
        status=ServiceCall.Status.SCHEDULED, due_at__lte=due_before, held_since__isnull=True
    )


def service_calls_overdue_count(
    *,
    due_before: datetime,
    limit: int,
    exclude: Collection[uuid.UUID] = (),
    exclude_tenants: Collection[str] = (),
) -> int:
    """How many such calls there are, `limit` at most (but those in `exclude`, and those of
    `exclude_tenants`, which have used their share of the worker's threads): the workers' cheap
    look (a read, an index probe) before they take threads of their pool and the write lock to
    start the due backlog.

    What `startable_due(due_before).exclude(pk__in=exclude).exclude(tenant_id__in=
    exclude_tenants)[:limit].count()` runs, but written once per process: every worker process
    looks every 20 ms, and the ORM's compilation of the query cost more than the index probe."""
    not_excluded = _not_excluded(exclude, exclude_tenants)
    [(count,)] = sql_query(
        "SELECT COUNT(*) FROM (SELECT 1 FROM {c} WHERE {c.status} = %s AND {c.due_at} <= %s AND {c.held_since} IS NULL"
        + not_excluded
        + " LIMIT %s) AS overdue",
        [ServiceCall.Status.SCHEDULED.value, due_before, *exclude, *exclude_tenants, limit],
        c=ServiceCall,
    )
    return count


def _not_excluded(exclude: Collection[uuid.UUID], exclude_tenants: Collection[str]) -> str:
    """The backlog's conditions for calls set aside and tenants without a free thread."""
    sql = f" AND NOT ({{c.service_call_id}} IN ({', '.join(['%s'] * len(exclude))}))" if exclude else ""
    if exclude_tenants:
        sql += f" AND NOT ({{c.tenant_id}} IN ({', '.join(['%s'] * len(exclude_tenants))}))"
    return sql


def service_calls_overdue(
    *,
    due_before: datetime,
    limit: int,
    exclude: Collection[uuid.UUID] = (),
    exclude_tenants: Collection[str] = (),
    lock: bool = False,
) -> list[tuple[str, uuid.UUID]]:
    """(tenant_id, service_call_id) of such calls, oldest due first. With `lock`, inside the
    caller's transaction, the rows are locked for their start, skipping those another
    transaction holds (PostgreSQL; on SQLite the write transaction keeps other writers out).

    What `startable_due(due_before).exclude(pk__in=exclude).exclude(tenant_id__in=
    exclude_tenants).order_by("due_at")[:limit]` (with `.select_for_update(skip_locked=True)`)
    runs, written once per process: the backlog loops run it inside the start's write
    transaction, for every chunk of a burst."""
    exclude, exclude_tenants = list(exclude), list(exclude_tenants)
    not_excluded = _not_excluded(exclude, exclude_tenants)
    locked = " FOR UPDATE SKIP LOCKED" if lock and connection.features.has_select_for_update_skip_locked else ""
    return [
        (tenant_id, db_uuid(pk))
        for tenant_id, pk in sql_query(
            "SELECT {c.tenant_id}, {c.service_call_id} FROM {c} "
            "WHERE {c.status} = %s AND {c.due_at} <= %s AND {c.held_since} IS NULL"
            + not_excluded
            + " ORDER BY {c.due_at} LIMIT %s"
            + locked,
            [ServiceCall.Status.SCHEDULED.value, due_before, *exclude, *exclude_tenants, limit],
            c=ServiceCall,
        )
    ]


def calls_using_connection(tenant_id: str, name: str, *, limit: int = 5) -> list[str]:
    """The tenant's live calls (Scheduled, Running) that name the connection, a few, for a
    refused delete (execution.connections.connection_delete)."""
    found = (
        ServiceCall.objects.filter(
            tenant_id=tenant_id,
            status__in=(ServiceCall.Status.SCHEDULED, ServiceCall.Status.RUNNING),
            request_spec__connection=name,
        )
        .order_by("service_call_id")
        .values_list("service_call_id", flat=True)[:limit]
    )
    return [f"call {pk}" for pk in found]
