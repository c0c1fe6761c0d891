"""Due order across starts (docs/flow-control.md, "Due order"): a tenant's newer call never
starts ahead of an older due call that another start has not decided yet, whether that start
is deciding it at this very moment (in another transaction, here a real one on PostgreSQL) or
has not reached it (a worker without room); and a call left undecided for longer than
orchestration.admission.UNDECIDED_SECONDS holds nothing back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from core.ids import utcnow
from execution.outcomes import Outcome
from orchestration.admission import UNDECIDED_SECONDS, flow_round
from orchestration.models import ServiceCall
from orchestration.services import service_call_finish
from tests.support.factories import make_call, make_flow_control
from tests.support.locks import paused_in_another_connection
from tests.support.plans import query_plan, recorded_queries, selects_from
from tests.support.starts import fresh, start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.also_postgres]

OK = Outcome(succeeded=True, status=200, headers={}, body_snippet="", latency_ms=1)
HOST_A = "http://127.0.0.1:9001/a"
HOST_B = "http://127.0.0.1:9002/b"


def due(name: str, *, ago_ms: float, url: str = HOST_A) -> ServiceCall:
    """A call of acme that fell due `ago_ms` ago (a submission makes a past due time now)."""
    call = make_call("acme", name=name, url=url, due_in=60)
    call.due_at = utcnow() - timedelta(milliseconds=ago_ms)
    ServiceCall.objects.filter(pk=call.pk).update(due_at=call.due_at)
    return call


def test_a_newer_call_waits_for_an_older_due_call_no_start_has_decided(world):
    # Room for both: only the order holds the newer one back.
    make_flow_control("acme", parallelism=5)
    older, newer = due("older", ago_ms=40), due("newer", ago_ms=20)
    assert start(newer) == []
    assert fresh(newer).held_since is not None and fresh(older).held_since is None
    assert start(older) == ["older"]
    assert start(newer) == ["newer"]
    assert fresh(older).started_at <= fresh(newer).started_at


def test_an_older_call_of_a_host_at_its_limit_does_not_hold_back_other_hosts(world):
    # The tenant has a limit of its own (so its calls to different hosts compete) and a host
    # limit, which is used up.
    make_flow_control("acme", parallelism=5, hosts={"127.0.0.1:9001": {"parallelism": 1}})
    assert start(due("first", ago_ms=60)) == ["first"]
    due("waiting for a worker", ago_ms=40)
    # Undecided, in the host's queue, whose host has no room: it holds back nobody else.
    assert start(due("elsewhere", ago_ms=20, url=HOST_B)) == ["elsewhere"]
    # Once that host has room, it goes first, before newer calls to other hosts too.
    service_call_finish(tenant_id="acme", service_call_id=ServiceCall.objects.get(name="first").pk, outcome=OK)
    assert start(due("elsewhere later", ago_ms=10, url=HOST_B)) == []


def test_an_undecided_call_in_the_tenants_queue_is_found_behind_a_hosts_backlog(world):
    make_flow_control("acme", parallelism=5, hosts={"127.0.0.1:9001": {"parallelism": 1}})
    assert start(due("first", ago_ms=900)) == ["first"]
    # More undecided calls to the host at its limit than a single look would read, all older
    # than the one call of the tenant's queue that waits for a worker.
    for n in range(70):
        due(f"host {n}", ago_ms=800 - n)
    due("tenant's queue", ago_ms=300, url=HOST_B)
    assert start(due("newer", ago_ms=20, url=HOST_B)) == []


def test_a_tenant_without_a_limit_of_its_own_keeps_its_unlimited_calls_unordered(world):
    # Only a host has a limit: the tenant's other calls never wait, so never for each other.
    make_flow_control("acme", hosts={"127.0.0.1:9001": {"parallelism": 1}})
    due("older", ago_ms=40, url=HOST_B)
    newer = due("newer", ago_ms=20, url=HOST_B)
    with recorded_queries() as queries:
        assert start(newer) == ["newer"]
    # Nothing could compete with it: no look for undecided calls either.
    assert not [sql for sql, _ in selects_from(queries, "service_calls") if '"held_since" IS NULL' in sql], queries


def test_a_call_undecided_for_longer_than_the_window_holds_nothing_back(world):
    make_flow_control("acme", parallelism=5)
    stuck = due("stuck", ago_ms=UNDECIDED_SECONDS * 1000 + 500)
    assert start(due("newer", ago_ms=20)) == ["newer"]
    assert fresh(stuck).status == ServiceCall.Status.SCHEDULED


def test_a_tenant_without_limits_is_not_ordered_at_all(world):
    due("older", ago_ms=40)
    assert start(due("newer", ago_ms=20)) == ["newer"]


def test_the_flow_loop_leaves_held_calls_behind_an_undecided_one_alone(world):
    """Its start would hold them again: a write transaction for nothing, fifty times a second."""
    make_flow_control("acme", parallelism=5)
    older, newer = due("older", ago_ms=40), due("newer", ago_ms=20)
    assert start(newer) == []
    assert flow_round(batch=50).starts == []
    assert start(older) == ["older"]
    assert flow_round(batch=50).starts == [("acme", [newer.pk])]


def test_the_look_for_undecided_calls_probes_its_index(world):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's EXPLAIN QUERY PLAN")
    make_flow_control("acme", parallelism=5)
    for n in range(3):
        make_call("acme", name=f"later {n}", url=HOST_A, due_in=60)
    newer = due("newer", ago_ms=20)
    with recorded_queries() as queries:
        start(newer)
    [(sql, params)] = [
        (sql, params)
        for sql, params in selects_from(queries, "service_calls")
        if '"held_since" IS NULL' in sql and "FOR UPDATE" not in sql and '"due_at" >' in sql
    ]
    plan = " | ".join(query_plan(sql, params))
    assert "service_calls_startable_tenant" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def test_a_call_another_start_is_deciding_goes_first(world):
    """Two starts at once, in two transactions: the one of the older call has locked its call
    and not yet reached the tenant's row when the newer call's start decides."""
    if connection.vendor != "postgresql":
        pytest.skip("two write transactions at once: PostgreSQL's row locks (SQLite has one writer)")
    make_flow_control("acme", parallelism=5)
    older, newer = due("older", ago_ms=40), due("newer", ago_ms=20)
    with paused_in_another_connection(
        lambda: start(older), before=lambda sql: 'FROM "flow_controls"' in sql and "FOR UPDATE" in sql
    ) as outcome:
        assert fresh(older).held_since is None  # locked by its start, not decided
        assert start(newer) == []
    assert outcome == [["older"]]
    assert start(newer) == ["newer"]
    assert fresh(older).started_at <= fresh(newer).started_at
    assert service_call_finish(tenant_id="acme", service_call_id=older.pk, outcome=OK)
