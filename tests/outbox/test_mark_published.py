"""outbox_mark_published: events marked published get their tenant's next feed numbers, once."""

from __future__ import annotations

import pytest
from django.db import transaction

from core.ids import utcnow
from outbox.models import OutboxEvent, OutboxFeedCounter
from outbox.services import outbox_mark_published
from tests.support.factories import make_event


def _mark(rows) -> int:
    with transaction.atomic():
        return outbox_mark_published(ids=[row.pk for row in rows], at=utcnow())


def _numbers(rows) -> list[int | None]:
    return [OutboxEvent.objects.get(pk=row.pk).feed_seq for row in rows]


def test_it_numbers_each_tenants_events_from_its_own_counter_in_id_order(db):
    a1, b1, a2 = make_event("acme"), make_event("globex"), make_event("acme")

    assert _mark([a2, b1, a1]) == 3

    assert _numbers([a1, a2, b1]) == [1, 2, 1]
    assert all(OutboxEvent.objects.get(pk=row.pk).published_at for row in (a1, a2, b1))
    assert dict(OutboxFeedCounter.objects.values_list("tenant_id", "last_seq")) == {"acme": 2, "globex": 1}


def test_an_event_marked_again_keeps_its_number_and_later_ones_continue(db):
    first = make_event()
    _mark([first])
    second = make_event()

    _mark([first, second])

    assert _numbers([first, second]) == [1, 2]
    assert OutboxFeedCounter.objects.get(tenant_id="acme").last_seq == 2


def test_it_refuses_to_run_outside_the_settling_transaction(transactional_db):
    row = make_event()
    with pytest.raises(RuntimeError):
        outbox_mark_published(ids=[row.pk], at=utcnow())
    assert _numbers([row]) == [None]


@pytest.fixture(params=["returning", "no-returning"])
def database(request, monkeypatch):
    """As the database is (UPDATE ... RETURNING), and as an SQLite before 3.35 would be."""
    if request.param == "no-returning":
        from django.db import connection

        monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)


def test_it_marks_only_the_rows_given_and_returns_how_many(db, database):
    """One UPDATE ... RETURNING marks the rows and tells which need a number; rows not given
    stay unpublished and unnumbered, a tenant's first event makes its counter row."""
    given = [make_event("initech"), make_event("acme"), make_event("initech")]
    other = make_event("initech")

    assert _mark(given) == 3
    assert _mark([]) == 0

    assert _numbers([*given, other]) == [1, 1, 2, None]
    assert OutboxEvent.objects.get(pk=other.pk).published_at is None
    assert dict(OutboxFeedCounter.objects.values_list("tenant_id", "last_seq")) == {"acme": 1, "initech": 2}
