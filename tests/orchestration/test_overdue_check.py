"""The workers' look for due calls nobody started (service_calls_overdue_exist) runs a statement
written once per process. It must answer as the ORM query it replaces does, over every case
that query tells apart, and probe the partial index service_calls_startable_due (SQLite's plan):
every worker process asks every 20 ms."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from core.ids import utcnow
from orchestration.models import ServiceCall
from orchestration.selectors import service_calls_overdue_exist, startable_due
from tests.support.factories import make_call
from tests.support.plans import query_plan, recorded_queries, selects_from


def orm_answer(due_before, exclude) -> bool:
    return startable_due(due_before).exclude(pk__in=list(exclude)).exists()


def test_it_answers_as_the_orm_query_does(db, world):
    now = utcnow()
    due = make_call(name="due", due_in=60)
    ServiceCall.objects.filter(pk=due.pk).update(due_at=now - timedelta(seconds=5))
    held = make_call(name="held", due_in=60)
    ServiceCall.objects.filter(pk=held.pk).update(due_at=now - timedelta(seconds=5), held_since=now)
    running = make_call(name="running", due_in=60)
    ServiceCall.objects.filter(pk=running.pk).update(due_at=now - timedelta(seconds=5), status="Running")
    make_call("globex", name="later", due_in=60)

    cases = [
        (now, []),  # the due one
        (now, [due.pk]),  # left out: held, running and later do not count
        (now - timedelta(seconds=10), []),  # nothing due that early
        (now + timedelta(seconds=120), [due.pk]),  # the later one, by then
        (now + timedelta(seconds=120), [due.pk, ServiceCall.objects.get(name="later").pk]),
    ]
    answers = [service_calls_overdue_exist(due_before=when, exclude=exclude) for when, exclude in cases]
    assert answers == [orm_answer(when, exclude) for when, exclude in cases]
    assert answers == [True, False, False, True, False]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's EXPLAIN QUERY PLAN")
@pytest.mark.parametrize("exclude", [0, 2])
def test_it_probes_the_startable_due_index(db, world, exclude):
    calls = [make_call(name=f"c{n}", due_in=60).pk for n in range(exclude)]
    with recorded_queries() as queries:
        service_calls_overdue_exist(due_before=utcnow(), exclude=calls)
    [(sql, params)] = selects_from(queries, "service_calls")
    plan = " | ".join(query_plan(sql, params))
    assert "service_calls_startable_due" in plan, plan
