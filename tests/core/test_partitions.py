"""core/partitions.py on PostgreSQL: the history tables partitioned by day, their partitions made
ahead (a row of a day without one waits in the DEFAULT partition, and moves to its day when it
is made), each partition with the table's own unique indexes, and a drop that gives up rather
than hold the table's queries (docs/schema.md, "History partitioned by day")."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from core.ids import utcnow
from core.partitions import AHEAD_DAYS, day_start, drop, drop_detached, is_partitioned, make_ahead, partitions
from delivery.partitions import ATTEMPT_DAYS, NOTIFICATION_DAYS
from outbox.models import OutboxEvent
from outbox.partitions import OUTBOX_DAYS
from outbox.services import outbox_partitions_make
from tests.support.factories import make_event
from tests.support.partitions import HISTORY, at_days_ago, day_ago, days_made, names
from workers.services import RUN_DAYS

pytestmark = pytest.mark.postgres


def _days(spec) -> list:
    return [p.lower.date() for p in partitions(spec) if not p.default and p.lower is not None]


def test_the_migrations_leave_each_history_table_partitioned_by_day_with_a_default_partition(db):
    today = day_start(utcnow()).date()
    for spec in HISTORY:
        assert is_partitioned(spec.table)
        found = partitions(spec)
        assert found[-1].default and found[-1].name == spec.default_name
        # The test database was made by `migrate` with empty tables: no past, days from yesterday
        # (where the loops' window of the open rows begins) to AHEAD_DAYS after today.
        assert _days(spec)[: AHEAD_DAYS + 2] == [today + timedelta(days=n) for n in range(-1, AHEAD_DAYS + 1)]
        assert {p.upper - p.lower for p in found if not p.default} == {timedelta(days=1)}


def test_the_days_ahead_are_made_once(db):
    later = utcnow() + timedelta(days=10)
    made = outbox_partitions_make(now=later)
    assert made == [OUTBOX_DAYS.partition_name((day_start(later) + timedelta(days=n)).date()) for n in range(3)]
    assert outbox_partitions_make(now=later) == []
    assert make_ahead(RUN_DAYS, now=later) and make_ahead(RUN_DAYS, now=later) == []


def test_a_row_of_a_day_without_its_partition_waits_in_the_default_one_and_moves_to_its_day(db):
    event = make_event(made_at=at_days_ago(5))
    assert _partition_of(event) == OUTBOX_DAYS.default_name

    days_made([5])

    assert _partition_of(event) == OUTBOX_DAYS.partition_name(day_ago(5))
    assert OutboxEvent.objects.get(pk=event.pk).event_payload == event.event_payload


def test_every_partition_holds_the_tables_own_unique_indexes(db):
    """A unique index without the partition key cannot be the partitioned table's: each
    partition has it (the outbox's id and feed numbers, a notification's event and subscription)."""
    days_made([3])
    for spec, suffixes in (
        (OUTBOX_DAYS, {"pkey", "tenant_feed"}),
        (NOTIFICATION_DAYS, {"event_subscription"}),
        (ATTEMPT_DAYS, {"pkey"}),
        (RUN_DAYS, {"pkey"}),
    ):
        for partition in names(spec):
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                    "WHERE x.indrelid = to_regclass(%s) AND x.indisunique "
                    "AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = x.indexrelid)",
                    [partition],
                )
                own = {name.removeprefix(f"{partition}_") for (name,) in cursor.fetchall()}
            assert own == suffixes, partition


def test_a_feed_number_is_still_unique_within_a_day(db):
    event = make_event()
    OutboxEvent.objects.filter(pk=event.pk).update(feed_seq=7)
    other = make_event()
    with pytest.raises(IntegrityError), transaction.atomic():
        OutboxEvent.objects.filter(pk=other.pk).update(feed_seq=7)


def test_a_drop_keeps_a_partition_that_holds_a_row_it_must_keep(db):
    days_made([40])
    event = make_event(made_at=at_days_ago(40))
    [day] = [p for p in partitions(OUTBOX_DAYS) if p.name == OUTBOX_DAYS.partition_name(day_ago(40))]

    assert not drop(OUTBOX_DAYS, day, unless="p.published_at IS NULL")
    assert OutboxEvent.objects.filter(pk=event.pk).exists()

    OutboxEvent.objects.filter(pk=event.pk).update(published_at=utcnow())
    assert drop(OUTBOX_DAYS, day, unless="p.published_at IS NULL")
    assert day.name not in names(OUTBOX_DAYS)
    assert not OutboxEvent.objects.filter(pk=event.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_drop_gives_up_soon_while_another_transaction_uses_the_table(world):
    """Its lock would queue every query of the table behind that transaction: it waits half a
    second at most and leaves the day to the next retention run."""
    days_made([40])
    [day] = [p for p in partitions(OUTBOX_DAYS) if p.name == OUTBOX_DAYS.partition_name(day_ago(40))]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(OutboxEvent.objects.all()[:1])
                holding.set()
                release.wait(20)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        assert not drop(OUTBOX_DAYS, day)
    finally:
        release.set()
        holder.join(10)
    assert day.name in names(OUTBOX_DAYS)
    assert drop(OUTBOX_DAYS, day)
    assert drop_detached(OUTBOX_DAYS) == [f"{day.name}_detached"]  # its files, in a step of their own


def _partition_of(event: OutboxEvent) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM outbox WHERE id = %s", [event.pk])
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_while_the_wake_ups_listen_a_window_looks_for_its_floor_again_only_once_its_channel_woke(settings):
    """An idle agent does not list the partitions and probe their open rows every second: the
    window of the unpublished events keeps its floor until a commit notifies the outbox."""
    from core.db.wakeups import Channel, wakeups
    from core.partition_queries import OpenWindow
    from outbox.partitions import UNPUBLISHED_SQL
    from tests.support.partitions import bulk_events

    settings.WAKEUPS = True
    wakeups.start()
    try:
        assert wakeups.listening
        days_made([3, 2, 1])
        window = OpenWindow(OUTBOX_DAYS, UNPUBLISHED_SQL, ttl=0, channel=Channel.OUTBOX)
        now = utcnow()
        floor, _ = window.bounds(now=now)
        assert OUTBOX_DAYS.time_of(floor).date() == day_ago(1)  # nothing open: yesterday's start
        # An event of three days ago left unpublished by a statement that notifies nobody.
        bulk_events(3, 1)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE outbox SET published_at = NULL")
        with CaptureQueriesContext(connection) as queries:
            assert window.bounds(now=now)[0] == floor
        assert not queries.captured_queries  # no wake since: kept, not looked for
        wakeups.wake_here(Channel.OUTBOX)
        assert OUTBOX_DAYS.time_of(window.bounds(now=now)[0]).date() == day_ago(3)
    finally:
        wakeups.stop()


def test_a_detached_past_partition_is_dropped_too(db):
    """A converted table's `<table>_past` goes by the same two steps as a day's partition."""
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE TABLE "{RUN_DAYS.table}_past_detached" (LIKE "{RUN_DAYS.table}")')
    assert drop_detached(RUN_DAYS) == [f"{RUN_DAYS.table}_past_detached"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [f"{RUN_DAYS.table}_past_detached"])
        assert cursor.fetchone()[0] is None
