"""Appending events: call inside the transaction of the state change they describe."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet

from core.db import (
    PreparedInsert,
    db_uuid,
    insert_rows_prepare,
    rows_per_insert,
    sql_query,
    sql_update_returning,
    update_many,
)
from core.db.wakeups import Channel, notify
from core.ids import epoch_ms, new_id
from core.partition_queries import key_range, open_floor, within
from core.partitions import drop, drop_past_days, is_partitioned, make_ahead
from outbox.models import OutboxEvent, OutboxFeedCounter
from outbox.partitions import OUTBOX_DAYS, UNPUBLISHED, UNPUBLISHED_SQL


@dataclass(frozen=True)
class NewEvent:
    tenant_id: str
    aggregate_id: uuid.UUID
    type: str
    payload: dict[str, Any]
    correlation_id: str
    at: datetime
    causation_id: str | None = None


def envelope_for(event: NewEvent, event_id: uuid.UUID) -> dict[str, Any]:
    return {
        "id": str(event_id),
        "type": event.type,
        "tenantId": event.tenant_id,
        "aggregateId": str(event.aggregate_id),
        "timestampMs": epoch_ms(event.at),
        "correlationId": event.correlation_id,
        "causationId": event.causation_id,
        "payload": event.payload,
    }


@dataclass(frozen=True)
class PreparedEvents:
    """Events made into outbox rows, their INSERTs ready (`outbox_prepare`)."""

    event_ids: list[uuid.UUID]
    inserts: list[PreparedInsert]


# The columns an event's row is written with: its own, then those that start at their model
# defaults (a retry count, a last error); the rest start empty (NULL).
_EVENT_FIELDS = ("event_id", "tenant_id", "aggregate_id", "event_type", "event_payload", "created_at")
_DEFAULT_FIELDS = ("attempts", "last_error")
_ROW_FIELDS = (*_EVENT_FIELDS, *_DEFAULT_FIELDS)
_DEFAULTS = tuple(OutboxEvent._meta.get_field(name).get_default() for name in _DEFAULT_FIELDS)


def outbox_prepare(*, events: list[NewEvent]) -> PreparedEvents:
    """The rows of `events` and their INSERTs, made before the transaction that appends them
    (`outbox_append(prepared=...)`), which then holds the write lock only to write. The rows
    are values, not model instances: nothing reads them back, and on a submission, the hottest
    write, two instances cost more than their INSERT's values."""
    event_ids = [new_id() for _ in events]
    rows = [
        (event_id, event.tenant_id, event.aggregate_id, event.type, envelope_for(event, event_id), event.at, *_DEFAULTS)
        for event, event_id in zip(events, event_ids, strict=True)
    ]
    step = rows_per_insert(len(_ROW_FIELDS))
    inserts = [
        insert_rows_prepare(OutboxEvent, fields=_ROW_FIELDS, rows=rows[start : start + step])
        for start in range(0, len(rows), step)
    ]
    return PreparedEvents(event_ids=event_ids, inserts=inserts)


def outbox_append(*, events: list[NewEvent] | None = None, prepared: PreparedEvents | None = None) -> list[uuid.UUID]:
    """Append events in order (given, or made by `outbox_prepare`); must run inside the caller's
    atomic block. Returns their event ids (`OutboxEvent.event_id`), in order; their rows' ids
    follow that order.

    A state change and its events commit together (docs/architecture.md, 'The path of one call').
    """
    if not connection.in_atomic_block:
        raise RuntimeError("outbox_append must run inside the state change's transaction")
    if prepared is None:
        prepared = outbox_prepare(events=events or [])
    for insert in prepared.inserts:
        insert.run()
    if prepared.inserts:  # the dispatcher publishes them once this commits
        notify(Channel.OUTBOX)
    return prepared.event_ids


def outbox_mark_published(*, ids: Sequence[int], at: datetime) -> int:
    """Mark events published and give each one seen for the first time the next number of its
    tenant's feed; must run inside the caller's atomic block. Returns the rows marked.

    The tenants' counter rows stay locked (taken in tenant order, so two dispatchers never
    deadlock) until the caller commits: a higher feed number can never commit before a lower
    one, so a reader past number n has seen every number below it (docs/architecture.md,
    'The events feed'). An event published again keeps its first number: it is in the feed once.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("outbox_mark_published must run inside the settling transaction")
    ids = sorted(ids)
    if not ids:
        return 0
    # Locks the rows first: whoever numbers them after us sees feed_seq set and skips them.
    # Statements written once per process (core.db.sql_query), not compiled for every batch:
    # the dispatcher runs this inside the write transaction the starts of due calls wait for.
    # Where the outbox is partitioned, the rows are sought only in the window of the unpublished
    # events (outbox/partitions.py), and numbered by their event id too: by id alone, each
    # statement would search every partition's key.
    partitioned = is_partitioned(OUTBOX_DAYS.table)
    window, bounds = within(UNPUBLISHED.bounds(now=at), "{t.event_id}")
    marked = sql_update_returning(
        OutboxEvent,
        assign="{t.published_at} = %s, {t.locked_until} = NULL",
        params=[at],
        keys=ids,
        returning="{t.id}, {t.tenant_id}, {t.feed_seq}, {t.event_id}",
        also=window,
        also_params=bounds,
    )
    unnumbered = sorted((pk, tenant_id, event_id) for pk, tenant_id, feed_seq, event_id in marked if feed_seq is None)
    if not unnumbered:
        return len(marked)
    tenant_ids = sorted({tenant_id for _, tenant_id, _ in unnumbered})
    last_seq = _feed_counters_locked(tenant_ids)
    numbered = []
    for pk, tenant_id, event_id in unnumbered:
        last_seq[tenant_id] += 1
        numbered.append((last_seq[tenant_id], pk, db_uuid(event_id)) if partitioned else (last_seq[tenant_id], pk))
    # One prepared UPDATE run per row: bulk_update would build a CASE of every row per batch.
    update_many(
        OutboxEvent,
        set_fields=("feed_seq",),
        where_fields=("id", "event_id") if partitioned else ("id",),
        rows=numbered,
    )
    update_many(
        OutboxFeedCounter,
        set_fields=("last_seq",),
        where_fields=("tenant_id",),
        rows=[(seq, tenant_id) for tenant_id, seq in last_seq.items()],
    )
    return len(marked)


def _feed_counters_locked(tenant_ids: list[str]) -> dict[str, int]:
    """{tenant: last feed number} of `tenant_ids` (sorted), their counter rows locked in tenant
    order until the caller commits (so two dispatchers never deadlock); a tenant's first event
    makes its row."""
    keys = ", ".join(["%s"] * len(tenant_ids))
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    select = (
        f"SELECT {{c.tenant_id}}, {{c.last_seq}} FROM {{c}} WHERE {{c.tenant_id}} IN ({keys}) ORDER BY {{c.tenant_id}}"
    )
    # Which rows exist, unlocked: a missing one is made before any is locked (made while holding
    # other counters' locks, it could deadlock with a dispatcher that locked it first).
    counters = dict(sql_query(select, tenant_ids, c=OutboxFeedCounter))
    missing = [tenant_id for tenant_id in tenant_ids if tenant_id not in counters]
    if missing:
        OutboxFeedCounter.objects.bulk_create(
            [OutboxFeedCounter(tenant_id=tenant_id) for tenant_id in missing], ignore_conflicts=True
        )
    if missing or lock:
        counters = dict(sql_query(select + lock, tenant_ids, c=OutboxFeedCounter))
    return counters


def outbox_publish_again(*, ids: Sequence[int]) -> int:
    """Operator action: clear backoff so rows are retried now (published ones go out again, and
    keep their place in the events feed)."""
    with transaction.atomic():
        again = OutboxEvent.objects.filter(pk__in=list(ids)).update(
            published_at=None, next_attempt_at=None, locked_until=None
        )
        if again:  # the dispatcher, and its window of the unpublished (outbox/partitions.py)
            notify(Channel.OUTBOX)
        return again


# Rows deleted per retention transaction: each holds the write lock a due timer waits for.
RETENTION_BATCH = 1000


def outbox_delete_published_before(
    *,
    before: datetime,
    batch_size: int = RETENTION_BATCH,
    write_guard: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> int:
    """Delete events published before `before`, in batches of `batch_size` (each in its own
    transaction, under `write_guard`); unpublished events are never deleted. Returns the count.

    Where the outbox is partitioned (PostgreSQL), a day whose events are all older than
    `before` and published goes whole: its partition is dropped (counted by PostgreSQL's
    estimate of its rows). A day with an unpublished event keeps its partition and loses its
    published events row by row, as does what no day's partition holds (a converted table's past,
    the DEFAULT partition's strays); a day not yet wholly past `before` waits for the next run.
    Uses outbox_published_at; see docs/schema.md (retention)."""
    deleted, left = drop_past_days(
        OUTBOX_DAYS,
        before=before,
        drop_day=lambda day: drop(OUTBOX_DAYS, day, unless=f"p.{UNPUBLISHED_SQL}"),
        write_guard=write_guard,
    )
    for lower, upper in left:
        rows = OutboxEvent.objects.filter(key_range("event_id", lower, upper))
        deleted += _delete_published(rows, before, batch_size, write_guard)
    return deleted


def _delete_published(
    rows: QuerySet[OutboxEvent],
    before: datetime,
    batch_size: int,
    write_guard: Callable[[], AbstractContextManager[None]],
) -> int:
    deleted = 0
    rows = rows.filter(published_at__lt=before).order_by("published_at")
    while True:
        with write_guard(), transaction.atomic():
            # By event id: where the outbox is partitioned by it, the DELETE searches only the
            # partitions of these rows.
            keys = list(rows.values_list("event_id", flat=True)[:batch_size])
            if keys:
                OutboxEvent.objects.filter(event_id__in=keys).delete()
        deleted += len(keys)
        if len(keys) < batch_size:
            return deleted


def outbox_partitions_make(*, now: datetime) -> list[str]:
    """Where the outbox is partitioned, today's partition and the next days', where missing
    (core.partitions.make_ahead); returns the names made."""
    return make_ahead(OUTBOX_DAYS, now=now)


def outbox_feed_floors_set(*, now: datetime) -> int:
    """Where the outbox is partitioned, each tenant's feed floor (OutboxFeedCounter.floor_seq,
    floor_key) moved up to the lowest event id an unpublished event has now: every event that
    gets a feed number after this is unpublished now or made from now on, so its id is at least
    that. The counters are read after that look (statements see what committed before they
    start) and locked in tenant order, as the dispatchers lock them. Returns how many moved."""
    if not is_partitioned(OUTBOX_DAYS.table):
        return 0
    floor = open_floor(OUTBOX_DAYS, UNPUBLISHED_SQL, now=now)
    if floor is None:
        return 0
    return len(
        sql_query(
            "UPDATE {c} SET {c.floor_seq} = {c}.{c.last_seq}, {c.floor_key} = %s "
            "FROM (SELECT {c.tenant_id} AS moved FROM {c} WHERE {c.floor_key} IS NULL OR {c.floor_key} < %s "
            "ORDER BY {c.tenant_id} FOR UPDATE) AS locked WHERE {c}.{c.tenant_id} = locked.moved "
            "RETURNING {c}.{c.tenant_id}",
            [floor, floor],
            c=OutboxFeedCounter,
        )
    )
