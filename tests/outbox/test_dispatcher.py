"""The dispatcher publishes in order per call, and one poisoned row never blocks the others."""

import threading
from datetime import timedelta

import pytest
from django.db import connection

from core.db import ChangeWatch
from core.ids import new_id, utcnow
from outbox.dispatcher import dispatch_batch
from outbox.models import OutboxEvent
from outbox.services import NewEvent, outbox_append, outbox_publish_again
from tests.support.factories import make_event
from tests.support.plans import recorded_queries, selects_from


class RecordingSink:
    name = "recording"

    def __init__(self, poisoned: set[str] = frozenset()):
        self.published: list[dict] = []
        self.poisoned = poisoned

    def publish(self, envelopes):
        for envelope in envelopes:
            if envelope["payload"].get("label") in self.poisoned:
                raise ConnectionError("sink refused it")
            self.published.append(envelope)


class RecordingSinkInTransaction(RecordingSink):
    """Published inside the dispatcher's transaction (outbox/dispatcher.py): all or nothing, as
    a sink writing to the database would be."""

    in_transaction = True

    def publish(self, envelopes):
        if any(envelope["payload"].get("label") in self.poisoned for envelope in envelopes):
            raise ConnectionError("sink refused it")
        self.published.extend(envelopes)


both_paths = pytest.mark.parametrize(
    "sink_class", [RecordingSink, RecordingSinkInTransaction], ids=["leased", "one-transaction"]
)


def orm_claimable(now):
    """The ORM's condition of a claimable row (not backing off, not leased), which the
    dispatcher's statements were written from."""
    from django.db.models import Q

    return (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)) & (
        Q(locked_until__isnull=True) | Q(locked_until__lte=now)
    )


def append(aggregate, label):
    return make_event(aggregate_id=aggregate, payload={"label": label})


@both_paths
def test_it_publishes_every_event_in_id_order_and_marks_it_published(db, sink_class):
    a, b = new_id(), new_id()
    for label, agg in [("a1", a), ("b1", b), ("a2", a), ("b2", b)]:
        append(agg, label)
    sink = sink_class()
    assert dispatch_batch(sinks=[sink]) == 4
    assert [e["payload"]["label"] for e in sink.published] == ["a1", "b1", "a2", "b2"]
    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
    assert dispatch_batch(sinks=[sink]) == 0


@both_paths
def test_a_poisoned_row_holds_back_only_its_own_calls_later_events(db, sink_class):
    a, b = new_id(), new_id()
    append(a, "a1-poison")
    append(b, "b1")
    append(a, "a2")
    append(b, "b2")
    sink = sink_class(poisoned={"a1-poison"})
    assert dispatch_batch(sinks=[sink]) == 2
    assert [e["payload"]["label"] for e in sink.published] == ["b1", "b2"]
    poisoned = OutboxEvent.objects.get(event_payload__payload__label="a1-poison")
    assert poisoned.attempts == 1 and poisoned.next_attempt_at > utcnow() and "sink refused" in poisoned.last_error
    # While a1 waits in backoff, a2 must not overtake it.
    assert dispatch_batch(sinks=[sink]) == 0
    assert OutboxEvent.objects.get(event_payload__payload__label="a2").published_at is None
    # Once the sink recovers and the backoff passed, a's events go out in order.
    OutboxEvent.objects.filter(pk=poisoned.pk).update(next_attempt_at=utcnow() - timedelta(seconds=1))
    healthy = sink_class()
    assert dispatch_batch(sinks=[healthy]) == 2
    assert [e["payload"]["label"] for e in healthy.published] == ["a1-poison", "a2"]


def test_rows_claimed_by_another_dispatcher_are_left_alone(db):
    a = new_id()
    first = append(a, "a1")
    append(a, "a2")
    OutboxEvent.objects.filter(pk=first.pk).update(locked_until=utcnow() + timedelta(seconds=30))
    sink = RecordingSink()
    assert dispatch_batch(sinks=[sink]) == 0  # a2 waits behind the claimed a1


def test_publish_again_requeues_rows(db):
    row = append(new_id(), "x")
    dispatch_batch(sinks=[RecordingSink()])
    assert outbox_publish_again(ids=[row.pk]) == 1
    sink = RecordingSink()
    assert dispatch_batch(sinks=[sink]) == 1 and sink.published[0]["id"] == str(row.event_id)


def test_the_envelope_carries_exactly_the_event_fields(db):
    agg = new_id()
    row = append(agg, "x")
    envelope = row.event_payload
    assert set(envelope) == {
        "id",
        "type",
        "tenantId",
        "aggregateId",
        "timestampMs",
        "correlationId",
        "causationId",
        "payload",
    }
    assert envelope["aggregateId"] == str(agg) and envelope["id"] == str(row.event_id)


def test_append_refuses_to_run_outside_a_transaction(transactional_db):
    with pytest.raises(RuntimeError):
        outbox_append(
            events=[
                NewEvent(
                    tenant_id="acme",
                    aggregate_id=new_id(),
                    type="ServiceCallTagged",
                    payload={},
                    correlation_id="c",
                    at=utcnow(),
                )
            ]
        )


def test_the_idle_look_sees_only_claimable_unpublished_events(db, world):
    """The idle dispatcher's look (claimable_exist, a statement written once per process) says
    yes exactly when the ORM finds a claimable unpublished row."""
    from outbox.dispatcher import claimable_exist

    def orm(now):
        return OutboxEvent.objects.filter(orm_claimable(now), published_at__isnull=True).exists()

    now = utcnow()
    assert claimable_exist(now) is orm(now) is False
    make_event(published_days_ago=1)
    assert claimable_exist(now) is orm(now) is False
    event = make_event()
    for changes, claimable in [
        ({"next_attempt_at": now + timedelta(seconds=30)}, False),  # backing off
        ({"next_attempt_at": now - timedelta(seconds=1), "locked_until": now + timedelta(seconds=30)}, False),
        ({"locked_until": now - timedelta(seconds=1)}, True),  # its lease ran out
        ({"next_attempt_at": None, "locked_until": None}, True),
    ]:
        OutboxEvent.objects.filter(pk=event.pk).update(**changes)
        assert claimable_exist(now) is orm(now) is claimable, changes


def test_the_claim_reads_what_the_orm_query_reads(db):
    """The claim's statements are written once per process (`_claimable_rows`): the same rows,
    in the same order, with the same values, as the ORM query they replaced, over the cases it
    tells apart: published, backing off, leased, a lease run out, and a call held back by an
    earlier event of its own in backoff."""
    from django.db import transaction
    from django.db.models import Q

    from outbox.dispatcher import _claimable_rows

    now = utcnow()
    blocked_call, free_call = new_id(), new_id()
    rows = [
        append(free_call, "first"),
        append(blocked_call, "backing off"),
        append(blocked_call, "behind it"),
        make_event("globex", payload={"label": "leased"}),
        make_event("globex", payload={"label": "lease ran out", "nested": [1, {"a": None}]}),
        make_event(published_days_ago=1),
        append(free_call, "second"),
    ]
    OutboxEvent.objects.filter(pk=rows[1].pk).update(next_attempt_at=now + timedelta(seconds=30), attempts=2)
    OutboxEvent.objects.filter(pk=rows[3].pk).update(locked_until=now + timedelta(seconds=30))
    OutboxEvent.objects.filter(pk=rows[4].pk).update(locked_until=now - timedelta(seconds=1), attempts=1)

    def orm(limit):
        unpublished = OutboxEvent.objects.filter(published_at__isnull=True)
        blocked = set(
            unpublished.filter(Q(next_attempt_at__gt=now) | Q(locked_until__gt=now)).values_list(
                "aggregate_id", flat=True
            )
        )
        candidates = unpublished.filter(orm_claimable(now)).order_by("id")[:limit]
        return [row for row in candidates if row.aggregate_id not in blocked]

    fields = ("id", "event_id", "tenant_id", "aggregate_id", "event_type", "event_payload", "created_at", "attempts")
    for limit in (100, 2, 1):
        with transaction.atomic():
            claimed = _claimable_rows(now, limit)
        expected = orm(limit)
        assert [[getattr(row, f) for f in fields] for row in claimed] == [
            [getattr(row, f) for f in fields] for row in expected
        ], limit
    assert [row.event_payload["payload"]["label"] for row in claimed] == ["first"]
    with transaction.atomic():
        labels = [row.event_payload["payload"]["label"] for row in _claimable_rows(now, 100)]
    assert labels == ["first", "lease ran out", "second"]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the skipped looks are SQLite's")
@pytest.mark.django_db(transaction=True)
def test_a_watched_dispatcher_skips_its_look_until_another_connection_commits():
    """The engine's dispatch loop passes its ChangeWatch: once a look found nothing claimable,
    the next looks are skipped until another connection commits, and what it committed is
    published at the next one."""
    sink, watch = RecordingSink(), ChangeWatch(recheck=60)
    append(new_id(), "first")
    assert dispatch_batch(sinks=[sink], watch=watch) == 1
    assert dispatch_batch(sinks=[sink], watch=watch) == 0  # it found one last time: it looks
    with recorded_queries() as queries:
        assert dispatch_batch(sinks=[sink], watch=watch) == 0
    assert not selects_from(queries, "outbox")

    def append_elsewhere() -> None:
        try:
            append(new_id(), "second")
        finally:
            connection.close()

    thread = threading.Thread(target=append_elsewhere)
    thread.start()
    thread.join(10)
    assert dispatch_batch(sinks=[sink], watch=watch) == 1
    assert [envelope["payload"]["label"] for envelope in sink.published] == ["first", "second"]
