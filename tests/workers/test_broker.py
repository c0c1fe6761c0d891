"""workers.broker.ORMBroker: django-q2's ORM broker, whose idle polls read the queue only after
a commit (core.db.ChangeWatch), and which still hands over every task."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django_q.brokers import get_broker

from tests.support.plans import recorded_queries, selects_from
from workers.broker import ORMBroker

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="the skipped reads are SQLite's")


def _enqueue_in_another_thread(broker: ORMBroker, payload: str) -> None:
    """As a web process's async_task: another connection, committed."""

    def enqueue() -> None:
        try:
            broker.enqueue(payload)
        finally:
            connection.close()

    thread = threading.Thread(target=enqueue)
    thread.start()
    thread.join(10)


@pytest.mark.django_db(transaction=True)
def test_the_cluster_uses_it_and_idle_polls_skip_the_read_until_a_task_is_enqueued():
    broker = get_broker("test-broker")
    assert isinstance(broker, ORMBroker)
    assert broker.dequeue() is None  # the first look reads
    # An idle pusher sleeps in its look until a task is queued: no read meanwhile, and no
    # ticking (core/db/wakeups.py).
    enqueue = threading.Timer(0.5, _enqueue_in_another_thread, [broker, "first"])
    started, looks = time.monotonic(), 0
    enqueue.start()
    try:
        with recorded_queries() as queries:
            while (found := broker.dequeue()) is None and time.monotonic() - started < 10:
                looks += 1
    finally:
        enqueue.join()
    [(_, payload)] = found
    assert payload == "first" and time.monotonic() - started >= 0.5
    # Each look either slept until a commit woke it or read once after one: a few, not a poll
    # every 50 ms (the fixture's own commits may wake the first).
    assert looks <= 4 and len(selects_from(queries, "django_q_ormq")) <= 3

    with recorded_queries() as queries:
        assert broker.dequeue() is None  # it found one last time: it reads
    assert len(selects_from(queries, "django_q_ormq")) == 1
