"""Retention of the outbox partitioned by day (PostgreSQL): a day wholly past retention whose
events are all published goes whole, at once however many they are; a day with an unpublished
event keeps it and loses the others row by row; a day not yet wholly past waits; what no day's
partition holds goes row by row as before (docs/schema.md, "History partitioned by day")."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from core.ids import utcnow
from outbox.models import OutboxEvent
from outbox.partitions import OUTBOX_DAYS
from outbox.services import outbox_delete_published_before
from tests.support.factories import make_event
from tests.support.partitions import at_days_ago, bulk_events, day_ago, days_made, names

pytestmark = pytest.mark.postgres

# Enough rows that a DELETE through them would take seconds; a drop takes milliseconds.
MANY = 100_000


def _cutoff():
    return utcnow() - timedelta(days=30)


def _published(days_ago: float = 35, **made) -> OutboxEvent:
    return make_event(published_days_ago=days_ago, **made)


def test_a_day_wholly_past_retention_and_published_goes_whole_at_once(db):
    days_made([40, 20])
    bulk_events(40, MANY)
    young = _published(20, made_at=at_days_ago(20))
    assert OutboxEvent.objects.count() == MANY + 1

    started = time.monotonic()
    deleted = outbox_delete_published_before(before=_cutoff())
    elapsed = time.monotonic() - started

    assert OUTBOX_DAYS.partition_name(day_ago(40)) not in names(OUTBOX_DAYS)
    assert list(OutboxEvent.objects.values_list("pk", flat=True)) == [young.pk]
    assert deleted == MANY  # PostgreSQL's estimate of the rows, exact after the ANALYZE
    assert elapsed < 1.0, elapsed


def test_a_day_with_an_unpublished_event_keeps_it_and_loses_its_published_ones(db):
    """Row by row, as where the outbox is not partitioned: those published before the cutoff."""
    days_made([40])
    waiting = make_event(made_at=at_days_ago(40))
    done = [_published(made_at=at_days_ago(40)) for _ in range(3)]
    late = _published(1, made_at=at_days_ago(40))

    assert outbox_delete_published_before(before=_cutoff(), batch_size=2) == 3

    assert OUTBOX_DAYS.partition_name(day_ago(40)) in names(OUTBOX_DAYS)
    assert set(OutboxEvent.objects.values_list("pk", flat=True)) == {waiting.pk, late.pk}
    assert not OutboxEvent.objects.filter(pk__in=[event.pk for event in done]).exists()


def test_a_day_not_wholly_past_retention_waits_for_the_next_run(db):
    """Its events published 40 days ago, made today: their day is not past retention."""
    events = [make_event(published_days_ago=40) for _ in range(2)]
    assert outbox_delete_published_before(before=_cutoff()) == 0
    assert OutboxEvent.objects.filter(pk__in=[event.pk for event in events]).count() == 2


def test_old_events_no_day_holds_go_row_by_row_as_before(db):
    """Events of a day without its partition wait in the DEFAULT one: those published before
    the cutoff go, the others stay."""
    _published(made_at=at_days_ago(45))
    late = _published(1, made_at=at_days_ago(45))
    waiting = make_event(made_at=at_days_ago(45))

    assert outbox_delete_published_before(before=_cutoff()) == 1

    assert set(OutboxEvent.objects.values_list("pk", flat=True)) == {late.pk, waiting.pk}
