"""workers.broker.ORMBroker: django-q2's ORM broker, whose idle polls read the queue only after
a commit (core.db.ChangeWatch), and which still hands over every task."""

from __future__ import annotations

import threading

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
    with recorded_queries() as queries:
        assert broker.dequeue() is None
        assert broker.dequeue() is None  # nothing committed since: no read
    assert len(selects_from(queries, "django_q_ormq")) == 1

    _enqueue_in_another_thread(broker, "first")
    [(_, payload)] = broker.dequeue()
    assert payload == "first"
    with recorded_queries() as queries:
        assert broker.dequeue() is None  # it found one last time: it reads
        assert broker.dequeue() is None
    assert len(selects_from(queries, "django_q_ormq")) == 1
