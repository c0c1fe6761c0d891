"""core.schema.PartitionByDay on PostgreSQL: the migrations that partition the history by day
convert tables that hold rows (docs/schema.md, "History partitioned by day"). The old rows become
one partition, taken as it is (its indexes attached, none built); the ids go on from the old
sequence; new rows of the next days go to their days' partitions; and going back makes plain
tables again with every row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection

from core.ids import utcnow
from core.partitions import day_start, is_partitioned, make_ahead, partitions
from delivery.models import DeliveryAttempt, Notification
from delivery.partitions import ATTEMPT_DAYS, NOTIFICATION_DAYS
from outbox.models import OutboxEvent
from outbox.partitions import OUTBOX_DAYS
from tests.support.factories import make_event
from tests.support.partitions import HISTORY, forget_windows
from tests.support.subscriptions import fan_out, make_subscription, record_try
from workers.models import LoopRun, WorkerSession
from workers.services import RUN_DAYS

pytestmark = pytest.mark.postgres

BEFORE = (("outbox", "0003"), ("delivery", "0004"), ("workers", "0006"))
# Columns that migrations after the partitioning ones add to the tables the history's rows are
# made through: the current code writes and reads them, so the test holds them while the schema
# is the old one, and lets their own migrations make them again.
LATER_COLUMNS = {"subscriptions": [("tags", "jsonb NOT NULL DEFAULT '[]'")]}


def _later_columns(*, add: bool) -> None:
    with connection.cursor() as cursor:
        for table, columns in LATER_COLUMNS.items():
            for name, definition in columns:
                if add:
                    cursor.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {definition}")
                else:
                    cursor.execute(f"ALTER TABLE {table} DROP COLUMN IF EXISTS {name}")


def _migrate(*args: str) -> None:
    call_command("migrate", *args, verbosity=0)
    forget_windows()


def _history() -> dict[str, set]:
    """Rows of every history table: events (one unpublished), their notifications with a try,
    loop runs."""
    make_subscription()
    events = [make_event(event_type="ServiceCallSubmitted") for _ in range(3)]
    OutboxEvent.objects.filter(pk__in=[e.pk for e in events[:2]]).update(published_at=utcnow())
    for event in events:
        for notification in fan_out(event.aggregate_id):
            record_try(notification, succeeded=True, status_code=200)
    session = WorkerSession.objects.create(id="s", hostname="h", pid=1, started_at=utcnow(), last_heartbeat_at=utcnow())
    for minutes in range(3):
        LoopRun.objects.create(
            session=session, loop="timer", started_at=utcnow() - timedelta(minutes=minutes), duration_ms=1
        )
    return _rows()


def _rows() -> dict[str, set]:
    return {
        "outbox": set(OutboxEvent.objects.values_list("id", "event_id", "published_at")),
        "notifications": set(Notification.objects.values_list("pk", "state")),
        "attempts": set(DeliveryAttempt.objects.values_list("pk", "notification_id", "n")),
        "runs": set(LoopRun.objects.values_list("pk", "started_at")),
    }


def _own_indexes(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = to_regclass(%s)",
            [table],
        )
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_the_migrations_partition_tables_that_hold_rows_and_go_back(world):
    for app, name in BEFORE:
        _migrate(app, name)
    _later_columns(add=True)
    try:
        assert not any(is_partitioned(spec.table) for spec in HISTORY)
        before = _history()
        indexes_before = _own_indexes("outbox")
        checks_before = {spec.table: _checks(spec.table) for spec in HISTORY}

        _later_columns(add=False)
        _migrate()

        tomorrow = day_start(utcnow()) + timedelta(days=1)
        for spec in HISTORY:
            assert is_partitioned(spec.table)
            past, first = partitions(spec)[:2]
            assert (past.name, past.lower, past.upper) == (spec.past_name, None, tomorrow)
            assert first.lower == tomorrow
        assert _rows() == before
        # The old table is the past's partition as it was: its indexes renamed, none built.
        assert _own_indexes("outbox_past") == {name.replace("outbox_", "outbox_past_", 1) for name in indexes_before}
        # Ids go on after the old ones; an event of a later day goes to that day's partition.
        later = make_event(made_at=tomorrow + timedelta(hours=1))  # tomorrow, whatever the hour now
        assert later.pk > max(pk for pk, _, _ in before["outbox"])
        assert _partition_of("outbox", "id", later.pk) == OUTBOX_DAYS.partition_name(tomorrow.date())
        [notification] = fan_out(later.aggregate_id)
        record_try(notification, succeeded=False, status_code=500)
        assert _partition_of("event_notifications", "notification_id", notification.pk) == (
            NOTIFICATION_DAYS.partition_name(tomorrow.date())
        )
        assert _partition_of("event_delivery_attempts", "notification_id", notification.pk) == (
            ATTEMPT_DAYS.partition_name(tomorrow.date())
        )
        after = _rows()

        for app, name in BEFORE:
            _migrate(app, name)

        assert not any(is_partitioned(spec.table) for spec in HISTORY)
        assert _rows() == after
        assert {spec.table: _checks(spec.table) for spec in HISTORY} == checks_before
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_constraint WHERE conrelid = 'event_delivery_attempts'::regclass "
                "AND contype = 'f' AND confrelid = 'event_notifications'::regclass"
            )
            assert cursor.fetchone()[0] == 1  # the tries' foreign key, made again
    finally:
        _later_columns(add=False)
        _migrate()
        _as_migrate_made_them()
    assert all(is_partitioned(spec.table) for spec in (OUTBOX_DAYS, NOTIFICATION_DAYS, ATTEMPT_DAYS, RUN_DAYS))


def _as_migrate_made_them() -> None:
    """The history tables as `migrate` made them on the empty test database, for the tests after
    this one: no past partition, days from yesterday on."""
    tables = ", ".join(spec.table for spec in HISTORY)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables}")
        for spec in HISTORY:
            cursor.execute(f"DROP TABLE IF EXISTS {spec.past_name}")
    for spec in HISTORY:
        make_ahead(spec, now=utcnow() - timedelta(days=1))
        make_ahead(spec, now=utcnow())


def _checks(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'c'", [table])
        return {row[0] for row in cursor.fetchall()}


def _partition_of(table: str, column: str, key) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {column} = %s", [key])
        return cursor.fetchone()[0]
