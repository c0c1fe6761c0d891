"""outbox_append: events stored in order inside the caller's transaction, the rows returned with
their ids, whether made at once or beforehand (outbox_prepare)."""

from __future__ import annotations

import pytest
from django.db import transaction

from core.db import INSERT_MAX_ROWS
from core.ids import new_id, utcnow
from outbox.models import OutboxEvent
from outbox.services import NewEvent, outbox_append, outbox_prepare


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


@pytest.mark.parametrize("count", [1, 2, INSERT_MAX_ROWS, INSERT_MAX_ROWS + 1])
def test_rows_come_back_with_their_ids_in_order_and_are_stored_as_given(db, count):
    with transaction.atomic():
        rows = outbox_append(events=_events(count))

    assert [row.pk for row in rows] == sorted(row.pk for row in rows) and None not in [row.pk for row in rows]
    assert all(not row._state.adding for row in rows)
    stored = {row.pk: row for row in OutboxEvent.objects.filter(pk__in=[row.pk for row in rows])}
    for row in rows:
        again = stored[row.pk]
        assert again.event_id == row.event_id and again.event_payload == row.event_payload
        assert again.created_at == row.created_at and again.published_at is None and again.attempts == 0
    assert [again.event_payload["payload"]["n"] for again in sorted(stored.values(), key=lambda r: r.pk)] == list(
        range(count)
    )


def test_events_made_before_the_transaction_are_stored_in_it(db):
    prepared = outbox_prepare(events=_events(2))
    assert OutboxEvent.objects.count() == 0

    with transaction.atomic():
        rows = outbox_append(prepared=prepared)

    assert list(OutboxEvent.objects.order_by("id").values_list("pk", flat=True)) == [row.pk for row in rows]


def test_a_transaction_that_fails_leaves_no_event(db):
    prepared = outbox_prepare(events=_events(2))
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox_append(prepared=prepared)
        raise RuntimeError("the state change failed")

    assert OutboxEvent.objects.count() == 0


def test_it_refuses_to_run_outside_a_transaction(transactional_db):
    with pytest.raises(RuntimeError, match="inside the state change's transaction"):
        outbox_append(events=_events(1))
