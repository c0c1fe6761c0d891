"""Timer registration and firing; the timer knows nothing of HTTP or of call state."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Field

from core.db import rows_per_insert, saver
from core.db.wakeups import Channel, notify
from core.ids import utcnow
from timer.models import TimerSchedule


def timer_register(*, tenant_id: str, service_call_id: uuid.UUID, due_at: datetime, correlation_id: str) -> bool:
    """Idempotent upsert; a Reached timer is never re-armed. Returns True if armed.

    One statement, an upsert: insert, or move a timer that is still Scheduled; the WHERE leaves
    a Reached one alone. It runs on every submission.
    """
    table = TimerSchedule._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (tenant_id, service_call_id, correlation_id, due_at, registered_at, state) "
            "VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (tenant_id, service_call_id) DO UPDATE "
            "SET due_at = excluded.due_at, correlation_id = excluded.correlation_id "
            f"WHERE {table}.state = %s",
            [
                tenant_id,
                _db_uuid(service_call_id),
                correlation_id,
                _db_datetime(due_at),
                _db_datetime(utcnow()),
                TimerSchedule.State.SCHEDULED,
                TimerSchedule.State.SCHEDULED,
            ],
        )
        armed = cursor.rowcount == 1
    if armed:  # the timer loop, asleep while idle, feeds it (docs/architecture.md, "Wake, don't poll")
        notify(Channel.TIMER)
    return armed


def timers_register(*, timers: Sequence[tuple[str, uuid.UUID, datetime, str]]) -> int:
    """`timer_register` for many new calls at once, `(tenant_id, service_call_id, due_at,
    correlation_id)` each, in as few statements as the database's parameter limit allows (a
    batch submission's). Returns how many were armed."""
    table = TimerSchedule._meta.db_table
    now = _db_datetime(utcnow())
    armed = 0
    step = rows_per_insert(6)
    with connection.cursor() as cursor:
        for start in range(0, len(timers), step):
            chunk = timers[start : start + step]
            params: list[object] = []
            for tenant_id, service_call_id, due_at, correlation_id in chunk:
                params += [tenant_id, _db_uuid(service_call_id), correlation_id, _db_datetime(due_at), now]
                params.append(TimerSchedule.State.SCHEDULED)
            cursor.execute(
                f"INSERT INTO {table} (tenant_id, service_call_id, correlation_id, due_at, registered_at, state) "
                f"VALUES {', '.join(['(%s, %s, %s, %s, %s, %s)'] * len(chunk))} "
                "ON CONFLICT (tenant_id, service_call_id) DO UPDATE "
                "SET due_at = excluded.due_at, correlation_id = excluded.correlation_id "
                f"WHERE {table}.state = %s",
                [*params, TimerSchedule.State.SCHEDULED],
            )
            armed += max(0, cursor.rowcount)
    if armed:
        notify(Channel.TIMER)
    return armed


def _db_uuid(value: uuid.UUID) -> object:
    conn = connections[DEFAULT_DB_ALIAS]
    return saver(_field("service_call").target_field, conn)(value, conn)


def _db_datetime(value: datetime) -> object:
    conn = connections[DEFAULT_DB_ALIAS]
    return saver(_field("due_at"), conn)(value, conn)


@cache
def _field(name: str) -> Field:
    return TimerSchedule._meta.get_field(name)


def timers_mark_reached(*, ids: Sequence[int]) -> int:
    """Scheduled -> Reached; zero rows means another worker fired them first."""
    if not ids:
        return 0
    with transaction.atomic():
        return TimerSchedule.objects.filter(pk__in=list(ids), state=TimerSchedule.State.SCHEDULED).update(
            state=TimerSchedule.State.REACHED, reached_at=utcnow()
        )


def timer_rearm(*, tenant_id: str, service_call_id: uuid.UUID, due_at: datetime, correlation_id: str) -> None:
    """Arm the call's timer again for its next attempt (a retry): a new row, so the workers'
    incremental feed, which reads timers by a growing id, sees it at once. The caller's
    transaction holds the call's own state change; a worker that fired the old timer and has
    not marked it Reached yet finds no row to mark."""
    with transaction.atomic():
        TimerSchedule.objects.filter(tenant_id=tenant_id, service_call_id=service_call_id).delete()
        TimerSchedule.objects.create(
            tenant_id=tenant_id,
            service_call_id=service_call_id,
            correlation_id=correlation_id,
            due_at=due_at,
            registered_at=utcnow(),
            state=TimerSchedule.State.SCHEDULED,
        )
        notify(Channel.TIMER)


def timers_discard(*, keys: Sequence[tuple[str, uuid.UUID]]) -> int:
    """Drop the timers of calls that will never start (cancelled); returns how many went. A
    worker holding one in its heap fires it into a start that finds nothing to start."""
    deleted = 0
    with transaction.atomic():
        for tenant_id, service_call_id in keys:
            deleted += TimerSchedule.objects.filter(tenant_id=tenant_id, service_call_id=service_call_id).delete()[0]
    return deleted
