"""Publishes outbox rows after commit: in id order per call; a bad row holds back only its call.

When every sink may publish inside a transaction (it writes only this database, or only logs:
`Sink.in_transaction`), a batch is claimed, published and marked published in one transaction,
the dispatchers of every cluster taking turns (core.db.take_turn): one write transaction per
batch instead of three. Otherwise a dispatcher claims rows with a short lease (conditional
update), publishes outside any transaction, then marks them published. Marking numbers them in
their tenant's events feed (outbox.services.outbox_mark_published). An aggregate with an
unpublished row in backoff or claimed by another dispatcher is skipped entirely, which keeps
each call's events in order while every other call's events flow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from functools import partial

from django.db import connection, transaction
from django.db.models import Q

from core.db import ChangeWatch, db_datetime, db_uuid, sql_query, take_turn
from core.ids import utcnow
from core.partition_queries import within
from core.partitions import is_partitioned
from outbox.models import OutboxEvent
from outbox.partitions import OUTBOX_DAYS, UNPUBLISHED
from outbox.services import outbox_mark_published
from outbox.sinks import BatchSink, ClaimedEvent, Sink, configured_sinks

logger = logging.getLogger(__name__)

LEASE = timedelta(seconds=30)
MAX_BACKOFF_SECONDS = 300


def backoff_seconds(attempts: int) -> float:
    return float(min(MAX_BACKOFF_SECONDS, 2 ** min(attempts, 10)))


def claimable_exist(now: datetime) -> bool:
    """Whether an unpublished row is claimable (not backing off, not leased): the idle
    dispatcher's look, twenty times a second, written once per process (core.db.sql_query)."""
    window, bounds = within(UNPUBLISHED.bounds(now=now), "{o.event_id}")
    return bool(
        sql_query(
            "SELECT 1 FROM {o} WHERE {o.published_at} IS NULL" + window + " "
            "AND ({o.next_attempt_at} IS NULL OR {o.next_attempt_at} <= %s) "
            "AND ({o.locked_until} IS NULL OR {o.locked_until} <= %s) LIMIT 1",
            [*bounds, now, now],
            o=OutboxEvent,
        )
    )


_CLAIMED_COLUMNS = "{o.id}, {o.event_id}, {o.tenant_id}, {o.aggregate_id}, {o.event_type}, {o.event_payload}, {o.created_at}, {o.attempts}"


def _claimable_rows(now: datetime, limit: int) -> list[ClaimedEvent]:
    """The first `limit` claimable rows in id order, less those of calls with an earlier row in
    backoff or leased to another dispatcher; run inside the claiming transaction (on PostgreSQL
    the rows are locked, skipping those another transaction holds).

    Statements written once per process (core.db.sql_query; tests/outbox/test_dispatcher.py
    holds the ORM queries they replaced), the rows read as
    `ClaimedEvent`s: compiling the queries and building model instances was half the
    dispatcher's time inside its write transaction, which the starts of due calls wait for.
    Where the outbox is partitioned, both keep to the window of the unpublished events
    (outbox/partitions.py)."""
    window, bounds = within(UNPUBLISHED.bounds(now=now), "{o.event_id}")
    blocked = {
        db_uuid(aggregate_id)
        for (aggregate_id,) in sql_query(
            "SELECT {o.aggregate_id} FROM {o} WHERE {o.published_at} IS NULL" + window + " "
            "AND ({o.next_attempt_at} > %s OR {o.locked_until} > %s)",
            [*bounds, now, now],
            o=OutboxEvent,
        )
    }
    lock = " FOR UPDATE SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
    rows = sql_query(
        f"SELECT {_CLAIMED_COLUMNS} FROM {{o}} WHERE {{o.published_at}} IS NULL" + window + " "
        "AND ({o.next_attempt_at} IS NULL OR {o.next_attempt_at} <= %s) "
        "AND ({o.locked_until} IS NULL OR {o.locked_until} <= %s) "
        "ORDER BY {o.id} LIMIT %s" + lock,
        [*bounds, now, now, limit],
        o=OutboxEvent,
    )
    payload = OutboxEvent._meta.get_field("event_payload")
    claimed = []
    for pk, event_id, tenant_id, aggregate_id, event_type, envelope, created_at, attempts in rows:
        aggregate_id = db_uuid(aggregate_id)
        if aggregate_id in blocked:
            continue
        claimed.append(
            ClaimedEvent(
                id=pk,
                event_id=db_uuid(event_id),
                tenant_id=tenant_id,
                aggregate_id=aggregate_id,
                event_type=event_type,
                event_payload=payload.from_db_value(envelope, None, connection),
                created_at=db_datetime(created_at),
                attempts=attempts,
            )
        )
    return claimed


def _the_rows(rows: Sequence[ClaimedEvent]) -> Q:
    """The rows of `rows` by key; by event id too where the outbox is partitioned by it, so that
    only their partitions are searched."""
    if is_partitioned(OUTBOX_DAYS.table):
        return Q(event_id__in=[row.event_id for row in rows])
    return Q(pk__in=[row.pk for row in rows])


def _claim(limit: int) -> list[ClaimedEvent]:
    with transaction.atomic():
        now = utcnow()
        claimed = _claimable_rows(now, limit)
        if claimed:
            OutboxEvent.objects.filter(_the_rows(claimed)).update(locked_until=now + LEASE)
    return claimed


def dispatch_batch(
    *,
    limit: int = 500,
    sinks: Sequence[Sink] | None = None,
    write_guard: Callable[[], AbstractContextManager] = nullcontext,
    watch: ChangeWatch | None = None,
) -> int:
    """Publish one batch; returns how many events were published.

    `write_guard` wraps each write transaction (the one of a batch; on the leased path the
    claim and the settling, not the publishing): the engine passes its process-wide write gate.
    `watch`: the polling loop's, which skips the first look while nothing was committed since
    it last found nothing claimable (core.db.ChangeWatch).
    """
    # A plain read first: an idle dispatcher polls often, and on SQLite every write
    # transaction takes the database's one write lock, which the timer loop may be waiting for.
    look = partial(claimable_exist, utcnow())
    if not (look() if watch is None else watch.read(look, empty=False)):
        return 0
    sinks = configured_sinks() if sinks is None else sinks
    if all(getattr(sink, "in_transaction", False) for sink in sinks):
        return _dispatch_in_one_transaction(limit, sinks, write_guard)
    with write_guard():
        rows = _claim(limit)
    if not rows:
        return 0
    published: list[int] = []
    failed: dict[int, str] = {}
    failed_aggregates: set = set()
    # A batch sink (the fan-out to subscribers) takes the whole batch in one write; if it fails,
    # the whole batch is tried again (it is idempotent).
    try:
        for sink in sinks:
            if isinstance(sink, BatchSink):
                with write_guard():
                    sink.publish_events(rows)
    except Exception as exc:
        logger.warning("event publication failed", extra={"sink": sink.name}, exc_info=True)
        failed = {row.pk: f"{type(exc).__name__}: {exc}"[:1000] for row in rows}
        rows_to_publish: list[ClaimedEvent] = []
    else:
        rows_to_publish = rows
    for row in rows_to_publish:
        if row.aggregate_id in failed_aggregates:
            continue  # keep this call's order: wait behind its failed event
        try:
            for sink in sinks:
                if not isinstance(sink, BatchSink):
                    sink.publish([row.event_payload])
        except Exception as exc:
            failed[row.pk] = f"{type(exc).__name__}: {exc}"[:1000]
            failed_aggregates.add(row.aggregate_id)
            _log_failure(row)
            continue
        published.append(row.pk)
    with write_guard():
        _settle(rows, published, failed)
    return len(published)


def _dispatch_in_one_transaction(
    limit: int, sinks: Sequence[Sink], write_guard: Callable[[], AbstractContextManager]
) -> int:
    """Claim, publish and mark in one transaction: no lease (nothing is out while the rows are
    locked), one write lock per batch. Dispatchers take turns (on PostgreSQL another's locked
    rows would be invisible here, and a call's later event could overtake its earlier one).

    If a sink fails, the batch is published again event by event, each in a savepoint: only
    the events that fail wait out a backoff (and their calls' later events behind them), and
    the backoff is written in this same transaction and turn, so no other dispatcher sees a
    failed event as neither published nor waiting."""
    with write_guard(), transaction.atomic():
        take_turn("outbox-dispatch")
        now = utcnow()
        rows = _claimable_rows(now, limit)
        if not rows:
            return 0
        try:
            with transaction.atomic():
                _publish_and_mark(rows, sinks, now)
            return len(rows)
        except Exception:
            logger.warning("event publication failed; publishing the batch event by event", exc_info=True)
        published = 0
        failed_calls: set = set()
        for row in rows:
            if row.aggregate_id in failed_calls:
                continue  # keeps its call's order: waits behind the failed event
            try:
                with transaction.atomic():
                    _publish_and_mark([row], sinks, now)
                published += 1
            except Exception as exc:
                failed_calls.add(row.aggregate_id)
                _log_failure(row)
                _back_off(row, f"{type(exc).__name__}: {exc}"[:1000], now)
        return published


def _publish_and_mark(rows: list[ClaimedEvent], sinks: Sequence[Sink], now: datetime) -> None:
    for sink in sinks:
        if isinstance(sink, BatchSink):
            sink.publish_events(rows)
        else:
            sink.publish([row.event_payload for row in rows])
    outbox_mark_published(ids=[row.pk for row in rows], at=now)


def _log_failure(row: ClaimedEvent) -> None:
    logger.warning(
        "event publication failed",
        extra={"tenantId": row.tenant_id, "serviceCallId": str(row.aggregate_id), "eventId": str(row.event_id)},
        exc_info=True,
    )


def _back_off(row: ClaimedEvent, error: str, now: datetime) -> None:
    """The row waits before its next try (and every later event of its call with it)."""
    attempts = row.attempts + 1
    OutboxEvent.objects.filter(_the_rows([row])).update(
        attempts=attempts,
        last_error=error,
        locked_until=None,
        next_attempt_at=now + timedelta(seconds=backoff_seconds(attempts)),
    )


def _settle(rows: list[ClaimedEvent], published: list[int], failed: dict[int, str]) -> None:
    done = set(published)
    with transaction.atomic():
        now = utcnow()
        for row in rows:
            if row.pk in failed:
                _back_off(row, failed[row.pk], now)
        skipped = [row for row in rows if row.pk not in failed and row.pk not in done]
        if skipped:
            OutboxEvent.objects.filter(_the_rows(skipped)).update(locked_until=None)
        # Last, so the feed counters it locks are held only until the commit that follows.
        outbox_mark_published(ids=published, at=now)
