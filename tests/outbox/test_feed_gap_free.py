"""The events feed is gap-free on PostgreSQL: while six writers commit events out of id order
and two dispatchers (as two clusters would) publish them, a reader following `iterator` sees
every event of its tenant exactly once, in feed order (docs/architecture.md, 'The events feed').

Ordering the feed by the outbox id fails here: a writer holds ids uncommitted (invisible) while
later ids commit, are published and read, and the reader's position is then past them forever.
Some transactions hold on until the reader has read past their ids, so that this happens on
every run rather than by chance.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from django.db import close_old_connections, connection, transaction

from core.ids import new_id, utcnow
from outbox.dispatcher import dispatch_batch
from outbox.models import OutboxEvent
from outbox.services import NewEvent, outbox_append
from tests.support.api import ApiClient

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WRITERS = 6  # the last one writes for globex, whose events acme's reader must never see
EVENTS_PER_WRITER = 40
DISPATCHERS = 2
READ_LIMIT = 5
# A straggling transaction waits at most this long for the reader to read past its ids.
STRAGGLE_SECONDS = 0.5
DEADLINE_SECONDS = 25

Page = tuple[list[dict], str, bool]


@dataclass
class Workload:
    written: dict[str, list[str]] = field(default_factory=lambda: {"acme": [], "globex": []})
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)
    # The highest outbox id (`sequence`) the reader has read; writers wait on it.
    highest_read: int = 0
    progress: threading.Condition = field(default_factory=threading.Condition)


class SlowSink:
    """Takes a moment per event, so the two dispatchers' claims and settles overlap. Published
    outside the dispatcher's transaction, on a lease."""

    name = "slow"
    in_transaction = False

    def publish(self, envelopes) -> None:
        time.sleep(0.0002 * len(envelopes))


class SlowSinkInTransaction(SlowSink):
    """The same, published inside it: the batch is claimed, published and marked in one
    transaction, the dispatchers taking turns (outbox/dispatcher.py)."""

    in_transaction = True


def _thread(work: Workload, body: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        try:
            body()
        except BaseException as exc:  # reported by the test, not lost in a thread
            with work.progress:
                work.errors.append(exc)
            work.stop.set()
        finally:
            connection.close()

    return threading.Thread(target=run, daemon=True)


def _wait_until_read_past(work: Workload, sequence: int) -> None:
    with work.progress:
        work.progress.wait_for(lambda: work.highest_read > sequence or work.stop.is_set(), timeout=STRAGGLE_SECONDS)


def _writer(work: Workload, n: int) -> Callable[[], None]:
    tenant = "globex" if n == WRITERS - 1 else "acme"

    def body() -> None:
        written = 0
        step = 0
        while written < EVENTS_PER_WRITER and not work.stop.is_set():
            size = min(1 + (n + step) % 4, EVENTS_PER_WRITER - written)  # 1–4 events a transaction
            with transaction.atomic():
                event_ids = outbox_append(
                    events=[
                        NewEvent(
                            tenant_id=tenant,
                            aggregate_id=new_id(),
                            type="ServiceCallTagged",
                            payload={"writer": n, "n": written + i},
                            correlation_id=f"w{n}",
                            at=utcnow(),
                        )
                        for i in range(size)
                    ]
                )
                # Hold the ids taken, uncommitted, while other writers' later ids commit: every
                # fourth transaction until the reader has read a later id, the others briefly.
                if tenant == "acme" and (n + step) % 4 == 0:
                    last = OutboxEvent.objects.filter(event_id__in=event_ids).order_by("-id")[0].pk
                    _wait_until_read_past(work, last)
                else:
                    time.sleep(0.001 * ((n * 7 + step * 3) % 4))
            with work.progress:
                work.written[tenant] += [str(event_id) for event_id in event_ids]
            written += size
            step += 1
            time.sleep(0.005)

    return body


def _dispatcher(work: Workload, sink) -> Callable[[], None]:
    def body() -> None:
        while not work.stop.is_set():
            if dispatch_batch(limit=7, sinks=[sink]) == 0:
                time.sleep(0.001)

    return body


def read_page(client: ApiClient, after: str | None) -> Page:
    params = {"limit": READ_LIMIT, **({"after": after} if after is not None else {})}
    response = client.get("/api/tenants/acme/events", params)
    assert response.status_code == 200, response.content
    body = response.json()
    return body["data"], body["iterator"], body["done"]


def run_feed_workload(world, read: Callable[[ApiClient, str | None], Page], sink=None) -> tuple[list[dict], list[str]]:
    """Writers, dispatchers and one reader at once, until every event is published and read;
    returns what the reader saw and the ids of acme's events written."""
    work = Workload()
    writers = [_thread(work, _writer(work, n)) for n in range(WRITERS)]
    dispatchers = [_thread(work, _dispatcher(work, sink or SlowSink())) for _ in range(DISPATCHERS)]
    for thread in writers + dispatchers:
        thread.start()

    client = ApiClient(world.acme_key)
    seen: list[dict] = []
    after: str | None = None
    deadline = time.monotonic() + DEADLINE_SECONDS
    try:
        while time.monotonic() < deadline and not work.errors:
            close_old_connections()
            # Checked before the page is read: a page read after everything was out is the last.
            writers_done = not any(thread.is_alive() for thread in writers)
            everything_out = writers_done and not OutboxEvent.objects.filter(published_at__isnull=True).exists()
            data, after, done = read(client, after)
            seen += data
            with work.progress:
                work.highest_read = max([work.highest_read, *(event["sequence"] for event in data)])
                work.progress.notify_all()
            if done and everything_out:
                break
            if done:
                time.sleep(0.001)
    finally:
        work.stop.set()
        with work.progress:
            work.progress.notify_all()
        for thread in writers + dispatchers:
            thread.join(timeout=10)
    assert not work.errors, work.errors
    assert time.monotonic() < deadline, "the workload did not finish in time"
    return seen, work.written["acme"]


@pytest.mark.parametrize("sink", [SlowSink, SlowSinkInTransaction], ids=["leased", "one-transaction"])
def test_a_reader_following_the_iterator_sees_every_event_once_while_writers_commit_out_of_order(world, sink):
    started = time.monotonic()

    seen, written = run_feed_workload(world, read_page, sink())

    ids = [event["id"] for event in seen]
    missed = set(written) - set(ids)
    assert not missed, f"{len(missed)} of {len(written)} events were skipped"
    assert len(ids) == len(set(ids)), "an event was read twice"
    assert set(ids) == set(written) and len(ids) == (WRITERS - 1) * EVENTS_PER_WRITER
    feed = OutboxEvent.objects.filter(tenant_id="acme").order_by("feed_seq")
    assert ids == [str(event_id) for event_id in feed.values_list("event_id", flat=True)]
    # Events were published out of id order, or this test proves nothing.
    by_feed = list(feed.values_list("id", flat=True))
    assert by_feed != sorted(by_feed)
    assert time.monotonic() - started < 30


class RecordingSinkInTransaction(SlowSinkInTransaction):
    """Notes what it was given, in order, and holds its batch's rows locked for a while that
    varies: the other dispatcher takes the next rows meanwhile and often finishes first."""

    def __init__(self) -> None:
        self.given: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.pauses = random.Random(13)

    def publish(self, envelopes) -> None:
        with self.lock:
            self.given += [(envelope["aggregateId"], envelope["id"]) for envelope in envelopes]
            pause = self.pauses.uniform(0, 0.03)
        time.sleep(pause)


def test_dispatchers_in_one_transaction_keep_each_calls_events_in_order(world):
    """Two dispatchers publishing in one transaction each, while writers append the events of
    the same few calls in many transactions: each call's events are numbered in the feed in the
    order they were written. Without the dispatchers taking turns, one would skip another's
    locked (uncommitted) row and publish the same call's next event before it."""
    calls = [new_id() for _ in range(8)]
    per_call = 15
    work = Workload()
    sink = RecordingSinkInTransaction()

    def writer(n: int) -> Callable[[], None]:
        def body() -> None:
            for step in range(per_call):
                for call in calls[n::2]:
                    with transaction.atomic():
                        outbox_append(
                            events=[
                                NewEvent(
                                    tenant_id="acme",
                                    aggregate_id=call,
                                    type="ServiceCallTagged",
                                    payload={"step": step},
                                    correlation_id=str(call),
                                    at=utcnow(),
                                )
                            ]
                        )
                time.sleep(0.001)

        return body

    writers = [_thread(work, writer(n)) for n in range(2)]
    dispatchers = [_thread(work, _dispatcher(work, sink)) for _ in range(DISPATCHERS)]
    for thread in writers + dispatchers:
        thread.start()
    deadline = time.monotonic() + DEADLINE_SECONDS
    for thread in writers:
        thread.join(timeout=DEADLINE_SECONDS)
    while OutboxEvent.objects.filter(published_at__isnull=True).exists() and time.monotonic() < deadline:
        time.sleep(0.03)
    work.stop.set()
    for thread in dispatchers:
        thread.join(timeout=10)
    assert not work.errors, work.errors

    rows = list(OutboxEvent.objects.filter(tenant_id="acme").order_by("feed_seq"))
    assert len(rows) == len(calls) * per_call and all(row.published_at for row in rows)
    for call in calls:
        steps = [row.event_payload["payload"]["step"] for row in rows if row.aggregate_id == call]
        assert steps == list(range(per_call)), f"call {call}: feed order {steps}"
    # Each event was given to the sink in a committed batch once (a rolled-back batch would be
    # given again); per call, what the sink was given last for each event follows the writes.
    ids = {str(row.event_id): row.event_payload["payload"]["step"] for row in rows}
    for call in calls:
        given = [ids[event_id] for aggregate, event_id in sink.given if aggregate == str(call)]
        assert given == sorted(given), f"call {call}: given to the sink as {given}"
