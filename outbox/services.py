"""Appending events: call inside the transaction of the state change they describe."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from core.db import PreparedInsert, insert_rows_prepare, rows_per_insert, sql_query, sql_update_returning, update_many
from core.db.wakeups import Channel, notify
from core.ids import epoch_ms, new_id
from outbox.models import OutboxEvent, OutboxFeedCounter


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
    marked = sql_update_returning(
        OutboxEvent,
        assign="{t.published_at} = %s, {t.locked_until} = NULL",
        params=[at],
        keys=ids,
        returning="{t.id}, {t.tenant_id}, {t.feed_seq}",
    )
    unnumbered = sorted((pk, tenant_id) for pk, tenant_id, feed_seq in marked if feed_seq is None)
    if not unnumbered:
        return len(marked)
    tenant_ids = sorted({tenant_id for _, tenant_id in unnumbered})
    last_seq = _feed_counters_locked(tenant_ids)
    numbered = []
    for pk, tenant_id in unnumbered:
        last_seq[tenant_id] += 1
        numbered.append((last_seq[tenant_id], pk))
    # One prepared UPDATE run per row: bulk_update would build a CASE of every row per batch.
    update_many(OutboxEvent, set_fields=("feed_seq",), where_fields=("id",), rows=numbered)
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
        return OutboxEvent.objects.filter(pk__in=list(ids)).update(
            published_at=None, next_attempt_at=None, locked_until=None
        )


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

    Uses outbox_published_at; see docs/schema.md (retention)."""
    deleted = 0
    while True:
        with write_guard(), transaction.atomic():
            ids = list(
                OutboxEvent.objects.filter(published_at__lt=before)
                .order_by("published_at")
                .values_list("id", flat=True)[:batch_size]
            )
            if ids:
                OutboxEvent.objects.filter(id__in=ids).delete()
        deleted += len(ids)
        if len(ids) < batch_size:
            return deleted
