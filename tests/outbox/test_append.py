"""outbox_append: events stored in order inside the caller's transaction, their event ids
returned, whether made at once or beforehand (outbox_prepare)."""

from __future__ import annotations

import pytest
from django.db import transaction

from core.db import INSERT_MAX_ROWS
from core.ids import new_id, utcnow
from outbox.models import OutboxEvent
from outbox.services import NewEvent, envelope_for, outbox_append, outbox_prepare


def _events(count: int, **fields) -> list[NewEvent]:
    aggregate = new_id()
    return [
        NewEvent(
            tenant_id=fields.get("tenant_id", "acme"),
            aggregate_id=aggregate,
            type="ServiceCallTagged",
            payload={"n": n, "text": 'é \u2028 "quoted"'},
            correlation_id="c",
            at=utcnow(),
        )
        for n in range(count)
    ]


@pytest.mark.parametrize("count", [1, 2, INSERT_MAX_ROWS, INSERT_MAX_ROWS + 1, 3 * INSERT_MAX_ROWS + 7])
def test_events_are_stored_as_given_in_order_and_their_ids_returned(db, count):
    events = _events(count)
    with transaction.atomic():
        event_ids = outbox_append(events=events)

    stored = list(OutboxEvent.objects.order_by("id"))
    # The rows' ids follow the events' order, across the several INSERTs of a large batch.
    assert [row.event_id for row in stored] == event_ids and len(set(event_ids)) == count
    for row, event, event_id in zip(stored, events, event_ids, strict=True):
        assert row.tenant_id == event.tenant_id and row.aggregate_id == event.aggregate_id
        assert row.event_type == event.type and row.created_at == event.at
        assert row.event_payload == envelope_for(event, event_id)
        assert row.published_at is None and row.attempts == 0 and row.last_error == "" and row.feed_seq is None
    assert [row.event_payload["payload"]["n"] for row in stored] == list(range(count))


def test_a_large_batch_is_written_in_inserts_within_the_databases_limit_of_parameters(db):
    from django.db import connection

    prepared = outbox_prepare(events=_events(3 * INSERT_MAX_ROWS + 7))

    # Rows per INSERT (eight values each: the columns an event is written with).
    assert [len(insert.params) // 8 for insert in prepared.inserts] == [INSERT_MAX_ROWS] * 3 + [7]
    limit = connection.features.max_query_params or float("inf")
    assert all(len(insert.params) <= limit for insert in prepared.inserts)


def test_events_made_before_the_transaction_are_stored_in_it(db):
    prepared = outbox_prepare(events=_events(2))
    assert OutboxEvent.objects.count() == 0

    with transaction.atomic():
        event_ids = outbox_append(prepared=prepared)

    assert list(OutboxEvent.objects.order_by("id").values_list("event_id", flat=True)) == event_ids


def test_a_transaction_that_fails_leaves_no_event(db):
    prepared = outbox_prepare(events=_events(2))
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox_append(prepared=prepared)
        raise RuntimeError("the state change failed")

    assert OutboxEvent.objects.count() == 0


def test_it_refuses_to_run_outside_a_transaction(transactional_db):
    with pytest.raises(RuntimeError, match="inside the state change's transaction"):
        outbox_append(events=_events(1))
