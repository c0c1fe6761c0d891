"""Reads of the timer table for the worker's near-term heap."""

from __future__ import annotations

from collections.abc import Collection, Container
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.db import db_datetime, db_uuid, sql_query
from timer.models import TimerSchedule


@dataclass(frozen=True)
class DueTimer:
    id: int
    tenant_id: str
    service_call_id: Any
    due_at: datetime
    correlation_id: str


def timers_due_before(
    *, until: datetime, after_id: int = 0, limit: int = 1000, known: Container[int] = frozenset()
) -> list[DueTimer]:
    """Scheduled timers due at or before `until`: oldest due first (timer_schedules_pending,
    partial on state='Scheduled').

    With after_id, only timers registered after that sequence (the incremental feed), in id
    order: a range on the primary key reads only the new rows, where the due-time index would
    read every pending timer in the horizon at each poll (thousands during a burst).

    Rows whose id is in `known` are left out before their values are read: the full refresh
    reads every timer of the horizon, nearly all of them already on the heap, and reading their
    UUIDs and due times took the timer loop 3-4 ms a second, a timer falling due meanwhile late
    by as much (docs/architecture.md, "Timer precision with a durable table").

    The timer loop's feed asks fifty times a second: the statement is written once per process
    (core.db.sql_query) rather than compiled by the ORM each time.
    """
    new_only = " AND {t.id} > %s" if after_id else ""
    order = "{t.id}" if after_id else "{t.due_at}"
    rows = sql_query(
        "SELECT {t.id}, {t.tenant}, {t.service_call}, {t.due_at}, {t.correlation_id} FROM {t} "
        f"WHERE {{t.state}} = %s AND {{t.due_at}} <= %s{new_only} ORDER BY {order} LIMIT %s",
        [TimerSchedule.State.SCHEDULED.value, until, *([after_id] if after_id else []), limit],
        t=TimerSchedule,
    )
    return [
        DueTimer(pk, tenant_id, db_uuid(call_id), db_datetime(due_at), correlation_id)
        for pk, tenant_id, call_id, due_at, correlation_id in rows
        if pk not in known
    ]


def timers_outlook(*, after: datetime) -> tuple[int, datetime | None]:
    """The highest timer id, and when the first Scheduled timer due after `after` is due (None:
    none is), in one statement: the full refresh's high-water mark, and how long an idle timer
    loop may wait before its next one (timer/scheduler.py)."""
    ((high, next_due),) = sql_query(
        "SELECT (SELECT MAX({t.id}) FROM {t}), "
        "(SELECT MIN({t.due_at}) FROM {t} WHERE {t.state} = %s AND {t.due_at} > %s)",
        [TimerSchedule.State.SCHEDULED.value, after],
        t=TimerSchedule,
    )
    return high or 0, db_datetime(next_due) if next_due is not None else None


def timers_backlog(*, now: datetime, tenant_ids: Collection[str] | None = None) -> dict[str, Any]:
    """Pending and overdue timers; with tenant_ids, only those tenants' (staff pages)."""
    pending = TimerSchedule.objects.filter(state=TimerSchedule.State.SCHEDULED)
    if tenant_ids is not None:
        pending = pending.filter(tenant_id__in=list(tenant_ids))
    overdue = pending.filter(due_at__lte=now)
    oldest = overdue.order_by("due_at").values_list("due_at", flat=True).first()
    return {
        "scheduled": pending.count(),
        "overdue": overdue.count(),
        "oldestOverdueSeconds": round((now - oldest).total_seconds(), 3) if oldest else 0.0,
    }


def calls_with_pending_timer(*, service_call_ids: Collection[Any]) -> set[Any]:
    """Which of these calls have a Scheduled timer."""
    return set(
        TimerSchedule.objects.filter(
            service_call_id__in=list(service_call_ids), state=TimerSchedule.State.SCHEDULED
        ).values_list("service_call_id", flat=True)
    )
