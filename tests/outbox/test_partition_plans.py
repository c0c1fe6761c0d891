"""The outbox partitioned by day (PostgreSQL): the queries as the code builds them read only the
partitions they need (docs/schema.md, "History partitioned by day"). The events feed read past its
tenant's floor reads from the floor's day on; a call's events from the day the call was made; the
dispatcher's looks, claims and marks only the window of the unpublished events. Each plan is
PostgreSQL's for the statement the selector or the dispatcher ran."""

from __future__ import annotations

import pytest

from core.ids import utcnow
from outbox.dispatcher import dispatch_batch
from outbox.models import OutboxFeedCounter
from outbox.partitions import OUTBOX_DAYS
from outbox.selectors import events_feed, events_for_call
from outbox.services import outbox_feed_floors_set
from outbox.sinks import LogSink
from tests.support.factories import make_event
from tests.support.partitions import (
    at_days_ago,
    bulk_events,
    dated,
    day_names,
    days_made,
    explain,
    forget_windows,
    partitions_read,
    reads,
    statements,
)

pytestmark = pytest.mark.postgres

OLD = [5, 4, 3, 2]
AHEAD = day_names(OUTBOX_DAYS, [0, -1, -2])


def _reads(run) -> list[list[str]]:
    return reads(run, OUTBOX_DAYS)


def _history() -> None:
    """Events on each of the last six days, all published and numbered."""
    days_made([*OLD, 1])
    for days_ago in [*OLD, 1]:
        make_event(made_at=at_days_ago(days_ago))
    forget_windows()
    assert dispatch_batch(sinks=[LogSink()]) == 5


def test_the_feed_past_the_tenants_floor_reads_from_the_floors_day_on(db):
    _history()
    outbox_feed_floors_set(now=utcnow())
    floor_seq, floor_key = OutboxFeedCounter.objects.values_list("floor_seq", "floor_key").get(tenant_id="acme")
    assert floor_seq == 5 and OUTBOX_DAYS.time_of(floor_key).date() == at_days_ago(1).date()
    make_event()
    forget_windows()
    dispatch_batch(sinks=[LogSink()])

    [read] = _reads(lambda: events_feed(tenant_id="acme", after=floor_seq))
    assert read == [*day_names(OUTBOX_DAYS, [1]), *AHEAD, OUTBOX_DAYS.default_name]

    # Behind the floor: every day (the later numbers may be anywhere before it).
    [read] = _reads(lambda: events_feed(tenant_id="acme", after=2))
    assert set(day_names(OUTBOX_DAYS, OLD)) <= set(read)


def test_a_reader_at_the_head_reads_no_partition(db):
    _history()
    assert _reads(lambda: events_feed(tenant_id="acme", after=5)) == []


def test_a_calls_events_are_read_from_the_day_the_call_was_made(db):
    days_made([*OLD, 1])
    call = dated(OUTBOX_DAYS, at_days_ago(3))
    for days_ago in (3, 1):
        make_event(aggregate_id=call, made_at=at_days_ago(days_ago))

    [read] = _reads(lambda: list(events_for_call(tenant_id="acme", service_call_id=call)))

    assert read == [*day_names(OUTBOX_DAYS, [3, 2, 1]), *AHEAD, OUTBOX_DAYS.default_name]
    assert len(events_for_call(tenant_id="acme", service_call_id=call)) == 2


def test_the_dispatcher_reads_only_the_window_of_the_unpublished_events(db):
    """From the oldest unpublished event's day (here three days ago) to tomorrow: every statement
    of a batch, its look, its claim and its marks. In each day with rows, the claim reads the
    partial index of the unpublished events, never along the key: the window takes in whole
    days, so its bound on the key selects nothing within them."""
    days_made([*OLD, 1])
    for days_ago in (3, 2, 1, 0):
        bulk_events(days_ago, 2000)
    make_event(made_at=at_days_ago(3))
    make_event()
    forget_windows()
    batch = statements(lambda: dispatch_batch(sinks=[LogSink()]))

    reads = [
        partitions_read(explain(sql, params), OUTBOX_DAYS)
        for sql, params in batch
        if 'FROM "outbox"' in sql or sql.startswith('UPDATE "outbox"')
    ]

    assert len(reads) >= 4  # the look, the blocked calls, the claim, the mark and numbering
    window = day_names(OUTBOX_DAYS, [3, 2, 1, 0, -1])
    assert all(read and set(read) <= set(window) for read in reads), reads
    [claim] = [(sql, params) for sql, params in batch if "FOR UPDATE SKIP LOCKED" in sql]
    plan = explain(*claim)
    busy = day_names(OUTBOX_DAYS, [3, 2, 1, 0])
    scans = [line for line in plan.splitlines() if any(f" on {name} " in line for name in busy)]
    assert scans and not any("Seq Scan" in line or "_pkey" in line for line in scans), plan
    # Numbered one by one, each by its own day (the first, three days old).
    assert day_names(OUTBOX_DAYS, [3]) in reads
