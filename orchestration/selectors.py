"""Reads of service calls for the API, the dashboard, the admin and the workers."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Prefetch, QuerySet

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


def service_calls_overdue_exist(*, due_before: datetime, exclude: Collection[uuid.UUID] = ()) -> bool:
    """Whether such a call exists (but those in `exclude`): the workers' cheap look (a read, an
    index probe) before they take the write lock to start the due backlog.

    What `startable_due(due_before).exclude(pk__in=exclude).exists()` runs, its statement
    written once per process: every worker process looks every 20 ms, and the ORM's compilation
    of the query cost more than the index probe."""
    conn, meta = connections[DEFAULT_DB_ALIAS], ServiceCall._meta
    key = (conn.vendor, len(exclude))
    sql = _OVERDUE_EXIST.get(key)
    if sql is None:
        q = conn.ops.quote_name
        status, due_at, held_since, pk = (
            q(meta.get_field(name).column) for name in ("status", "due_at", "held_since", "service_call_id")
        )
        not_excluded = f" AND NOT ({pk} IN ({', '.join(['%s'] * len(exclude))}))" if exclude else ""
        sql = (
            f"SELECT 1 FROM {q(meta.db_table)} WHERE {status} = %s AND {due_at} <= %s "
            f"AND {held_since} IS NULL{not_excluded} LIMIT 1"
        )
        _OVERDUE_EXIST[key] = sql  # a race writes the same statement twice: harmless
    params = [
        ServiceCall.Status.SCHEDULED.value,
        meta.get_field("due_at").get_db_prep_value(due_before, conn),
        *(meta.pk.get_db_prep_value(pk, conn) for pk in exclude),
    ]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None


# service_calls_overdue_exist's statements, by vendor and number of calls left out.
_OVERDUE_EXIST: dict[tuple[str, int], str] = {}


def service_calls_overdue(
    *, due_before: datetime, limit: int, exclude: Collection[uuid.UUID] = ()
) -> list[tuple[str, uuid.UUID]]:
    """(tenant_id, service_call_id) of such calls, oldest due first."""
    rows = startable_due(due_before).exclude(pk__in=list(exclude)).order_by("due_at")
    return list(rows.values_list("tenant_id", "service_call_id")[:limit])
