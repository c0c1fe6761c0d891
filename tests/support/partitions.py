"""The history partitioned by day, in tests on PostgreSQL (docs/schema.md, "History partitioned
by day"): past days' partitions made for rows dated in them, rows dated in the past, and which
partitions a query's plan reads."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from datetime import date, datetime, timedelta
from typing import Any

from django.db import connection, transaction

from core.ids import new_id_dated_as, utcnow
from core.partitions import DailyPartitions, day_start, make_days
from delivery.partitions import ATTEMPT_DAYS, NOTIFICATION_DAYS, OPEN
from outbox.partitions import OUTBOX_DAYS, UNPUBLISHED
from workers.services import RUN_DAYS

HISTORY = (OUTBOX_DAYS, NOTIFICATION_DAYS, ATTEMPT_DAYS, RUN_DAYS)


def day_ago(days: int) -> date:
    return (day_start(utcnow()) - timedelta(days=days)).date()


def at_days_ago(days: float) -> datetime:
    """Noon of the day `days` ago (whole days; today, before noon: a minute ago, within today), or
    that long ago."""
    now = utcnow()
    if float(days).is_integer():
        noon = day_start(now) - timedelta(days=days) + timedelta(hours=12)
        return noon if noon < now else max(day_start(now), now - timedelta(minutes=1))
    return now - timedelta(days=days)


def days_made(days_ago: Iterable[int]) -> None:
    """The partitions of those past days, of every partitioned history table."""
    days = [day_ago(n) for n in days_ago]
    for spec in HISTORY:
        make_days(spec, days)
    forget_windows()


def forget_windows() -> None:
    """The loops' windows of the open rows looked for afresh (each process keeps its own for a
    second: core.partition_queries.OpenWindow)."""
    UNPUBLISHED.forget()
    OPEN.forget()


def dated(spec: DailyPartitions, at: datetime) -> Any:
    """A new key of `spec`'s table dated `at`."""
    return new_id_dated_as(spec.key_at(at))


def names(spec: DailyPartitions) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%s) ORDER BY 1",
            [f'"{spec.table}"'],
        )
        return [row[0] for row in cursor.fetchall()]


def explain(sql: str, params: Sequence[Any], *, analyze: bool = False) -> str:
    """PostgreSQL's plan of `sql` (run, with `analyze`, and rolled back)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(("EXPLAIN (ANALYZE, COSTS OFF) " if analyze else "EXPLAIN (COSTS OFF) ") + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


def partitions_read(plan: str, spec: DailyPartitions) -> list[str]:
    """The partitions of `spec`'s table that `plan` scans (less those EXPLAIN ANALYZE shows never
    executed), in the plan's order."""
    pattern = re.compile(rf"\bon ({re.escape(spec.table)}_(?:p\d{{8}}|default|past))\b")
    found = []
    for line in plan.splitlines():
        matched = pattern.search(line)
        if matched and "never executed" not in line and matched.group(1) not in found:
            found.append(matched.group(1))
    return found


def day_names(spec: DailyPartitions, days_ago: Iterable[int]) -> list[str]:
    return [spec.partition_name(day_ago(n)) for n in days_ago]


def statements(run: Callable[[], Any]) -> list[tuple[str, tuple[Any, ...]]]:
    """(sql, params) of each statement `run` makes (one run for many rows, with its first
    row's values)."""
    queries = []

    def record(execute, sql, params, many, context):
        queries.append((sql, tuple((params[0] if many else params) or ())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        run()
    return queries


def reads(run: Callable[[], Any], spec: DailyPartitions) -> list[list[str]]:
    """The partitions of `spec`'s table that each statement `run` makes on it reads, in order."""
    table = f'"{spec.table}"'
    return [
        partitions_read(explain(sql, params), spec)
        for sql, params in statements(run)
        if f"FROM {table}" in sql or sql.startswith(f"UPDATE {table}")
    ]


# A UUID v7 of the millisecond `start` + g (g of a generate_series), in SQL.
_KEY = "(lpad(to_hex(%s::bigint + g), 12, '0') || '7000' || '8' || lpad(to_hex(g), 15, '0'))::uuid"


def _day_ms(days_ago: int) -> int:
    return int((day_start(utcnow()) - timedelta(days=days_ago)).timestamp() * 1000)


def bulk_events(days_ago: int, count: int, *, tenant_id: str = "acme") -> None:
    """`count` events made on the day `days_ago`, published a day ago, in one statement."""
    start = _day_ms(days_ago)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO outbox (event_id, tenant_id, aggregate_id, event_type, event_payload, created_at, "
            f"published_at, attempts, last_error) SELECT {_KEY}, %s, gen_random_uuid(), 'ServiceCallSubmitted', "
            "'{\"n\": 1}', to_timestamp((%s::bigint + g) / 1000.0), now() - interval '1 day', 0, '' "
            "FROM generate_series(1, %s) AS g",
            [start, tenant_id, start, count],
        )
        cursor.execute("ANALYZE outbox")


def bulk_delivered(days_ago: int, count: int, subscription: Any) -> None:
    """`count` delivered notifications of `subscription` of events of the day `days_ago`, with a
    try each, in two statements."""
    start = _day_ms(days_ago)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO event_notifications (notification_id, subscription_id, tenant_id, event_id, event_seq, "
            "aggregate_id, event_type, envelope, event_created_at, state, attempts, step, manual, last_error, "
            f"delivered_at, created_at, updated_at) SELECT {_KEY}, %s, 'acme', {_KEY}, g, gen_random_uuid(), "
            "'ServiceCallSubmitted', '{\"id\": 1}', now(), 'SUCCEEDED', 1, 0, false, '', now(), now(), now() "
            "FROM generate_series(1, %s) AS g",
            [start, subscription.pk, start, count],
        )
        cursor.execute(
            "INSERT INTO event_delivery_attempts (notification_id, n, trigger, started_at, status_code, "
            f"response_snippet, error) SELECT {_KEY}, 1, 'scheduled', now(), 200, '', '' "
            "FROM generate_series(1, %s) AS g",
            [start, count],
        )
        cursor.execute("ANALYZE event_notifications, event_delivery_attempts")
