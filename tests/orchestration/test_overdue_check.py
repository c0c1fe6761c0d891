"""The workers' look for due calls nobody started (service_calls_overdue_count) runs a statement
written once per process. It must answer as the ORM query it replaces does, over every case
that query tells apart, and probe the partial index service_calls_startable_due (SQLite's plan):
every worker process asks every 20 ms."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from core.ids import utcnow
from orchestration.models import ServiceCall
from orchestration.selectors import service_calls_overdue_count, startable_due
from tests.support.factories import make_call
from tests.support.plans import query_plan, recorded_queries, selects_from


def orm_answer(due_before, exclude, limit) -> int:
    return startable_due(due_before).exclude(pk__in=list(exclude))[:limit].count()


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
    for limit in (1, 2, 100):
        answers = [
            service_calls_overdue_count(due_before=when, exclude=exclude, limit=limit) for when, exclude in cases
        ]
        assert answers == [orm_answer(when, exclude, limit) for when, exclude in cases]
        assert answers == [1, 0, 0, 1, 0] if limit == 1 else [1, 0, 0, 2, 0]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's EXPLAIN QUERY PLAN")
@pytest.mark.parametrize("exclude", [0, 2])
def test_it_probes_the_startable_due_index(db, world, exclude):
    calls = [make_call(name=f"c{n}", due_in=60).pk for n in range(exclude)]
    with recorded_queries() as queries:
        service_calls_overdue_count(due_before=utcnow(), exclude=calls, limit=100)
    [(sql, params)] = selects_from(queries, "service_calls")
    plan = " | ".join(query_plan(sql, params))
    assert "service_calls_startable_due" in plan, plan


def test_the_backlogs_keys_are_the_orm_querys_rows_in_due_order(db, world):
    """service_calls_overdue, run inside the backlog's start transaction for every chunk of a
    burst, is a statement written once per process: the same calls, in the same order, as the
    ORM query it replaced, over the cases that query tells apart."""
    from orchestration.selectors import service_calls_overdue

    now = utcnow()
    calls = []
    for seconds_ago, tenant in [(5, "acme"), (30, "globex"), (10, "acme"), (1, "globex")]:
        call = make_call(tenant, name=f"due {seconds_ago}s ago", due_in=60)
        ServiceCall.objects.filter(pk=call.pk).update(due_at=now - timedelta(seconds=seconds_ago))
        calls.append(call)
    held = make_call(name="held", due_in=60)
    ServiceCall.objects.filter(pk=held.pk).update(due_at=now - timedelta(seconds=50), held_since=now)
    running = make_call(name="running", due_in=60)
    ServiceCall.objects.filter(pk=running.pk).update(due_at=now - timedelta(seconds=50), status="Running")
    make_call(name="later", due_in=60)

    def orm(due_before, limit, exclude):
        rows = startable_due(due_before).exclude(pk__in=list(exclude)).order_by("due_at")
        return list(rows.values_list("tenant_id", "service_call_id")[:limit])

    cases = [
        (now, 10, []),
        (now, 2, []),  # the two due longest ago
        (now, 10, [calls[1].pk, calls[2].pk]),
        (now - timedelta(seconds=8), 10, []),  # due 10 and 30 s ago only
        (now + timedelta(seconds=120), 10, []),  # the later one too, last
        (now, 0, []),
    ]
    for due_before, limit, exclude in cases:
        for lock in (False, True):
            got = service_calls_overdue(due_before=due_before, limit=limit, exclude=exclude, lock=lock)
            assert got == orm(due_before, limit, exclude), (due_before, limit, exclude, lock)
    order = [pk for _, pk in service_calls_overdue(due_before=now, limit=10)]
    assert order == [calls[1].pk, calls[2].pk, calls[0].pk, calls[3].pk]
