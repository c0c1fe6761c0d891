"""Flow control at the start of calls (orchestration.admission through service_calls_start):
calls over a limit stay Scheduled and held, in due order, start when there is room, and keep
how long they waited (docs/flow-control.md)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection

from core.ids import utcnow
from execution.outcomes import ErrorKind, Outcome
from orchestration.admission import any_held, flow_limits_get, flow_round, held_count, held_ms_of
from orchestration.flow import LOOKAHEAD_SECONDS
from orchestration.models import FlowControl, ServiceCall
from orchestration.services import (
    CallKey,
    service_call_cancel,
    service_call_finish,
    service_calls_finish,
    service_calls_rearm_overdue,
    service_calls_start,
)
from outbox.models import OutboxEvent
from tests.support.factories import make_call, make_flow_control
from tests.support.plans import query_plan, recorded_queries, selects_from
from tests.support.starts import fresh, start

OK = Outcome(succeeded=True, status=200, headers={}, body_snippet="", latency_ms=1)
HTTP_503 = Outcome.failure(ErrorKind.HTTP_ERROR, "503", status=503, latency_ms=5)
HOST_A = "http://127.0.0.1:9001/a"
HOST_B = "http://127.0.0.1:9002/b"


def calls(n: int, tenant: str = "acme", *, url: str = HOST_A, name: str = "c") -> list[ServiceCall]:
    """n calls due now, in due order (each due a millisecond after the one before)."""
    first = utcnow() - timedelta(seconds=1)
    return [make_call(tenant, name=f"{name}{i}", url=url, due_at=first + timedelta(milliseconds=i)) for i in range(n)]


def finish(*rows: ServiceCall) -> None:
    for row in rows:
        assert service_call_finish(tenant_id=row.tenant_id, service_call_id=row.pk, outcome=OK)


def test_a_call_records_its_target_host_at_submission(world):
    assert make_call(url="https://API.example.com:443/x").target_host == "api.example.com"
    assert make_call(url=HOST_A).target_host == "127.0.0.1:9001"


def test_calls_over_the_parallelism_stay_scheduled_and_held(world):
    make_flow_control("acme", parallelism=2)
    rows = calls(5)
    assert start(*rows) == ["c0", "c1"]
    held = [fresh(row) for row in rows[2:]]
    assert all(row.status == ServiceCall.Status.SCHEDULED and row.held_since is not None for row in held)
    assert all(row.held_queue == "" for row in held)
    assert held_count(tenant_id="acme") == 3


def test_a_held_call_starts_when_a_running_one_finishes_and_keeps_its_wait(world):
    make_flow_control("acme", parallelism=1)
    first, second = calls(2)
    assert start(first, second) == ["c0"]
    assert start(second) == []  # still no room
    held_since = fresh(second).held_since
    time.sleep(0.05)
    finish(first)
    assert start(second) == ["c1"]
    row = fresh(second)
    assert row.status == ServiceCall.Status.RUNNING and row.held_since is None and row.held_queue == ""
    assert row.held_ms >= 50 and row.held_ms == int((row.started_at - held_since) / timedelta(milliseconds=1))
    running = OutboxEvent.objects.get(aggregate_id=second.pk, event_type="ServiceCallRunning")
    assert running.event_payload["payload"]["heldMs"] == row.held_ms
    # A call never held says nothing of it.
    first_running = OutboxEvent.objects.get(aggregate_id=first.pk, event_type="ServiceCallRunning")
    assert "heldMs" not in first_running.event_payload["payload"]


def test_the_flow_loops_look_for_held_calls_sees_them_and_only_them(world):
    """any_held, the flow loop's look 50 times a second (a statement written once per process),
    answers as the ORM's query of held calls does."""
    from orchestration.admission.held import _held

    first = make_call(name="first", due_in=60)
    assert any_held() is _held().exists() is False  # Scheduled, not held
    ServiceCall.objects.filter(pk=first.pk).update(held_since=utcnow(), held_queue="example.test")
    assert any_held() is _held().exists() is True
    ServiceCall.objects.filter(pk=first.pk).update(held_since=None, held_queue="")
    assert any_held() is _held().exists() is False


def test_held_calls_go_first_in_due_order(world):
    make_flow_control("acme", parallelism=1)
    c0, c1, c2 = calls(3)
    assert start(c0, c1) == ["c0"]
    finish(c0)
    # The timer fires the newer c2 first: the older held c1 has the room.
    assert start(c2) == []
    assert fresh(c2).held_since is not None
    assert start(c1, c2) == ["c1"]
    finish(c1)
    assert start(c2) == ["c2"]


def test_the_rate_lets_one_start_per_interval(world):
    make_flow_control("acme", rate=2)
    c0, c1 = calls(2)
    before = time.time()
    assert start(c0, c1) == ["c0"]
    tat = FlowControl.objects.get(pk="acme").tenant_tat
    assert before + 0.5 <= tat <= time.time() + 0.5
    assert start(c1) == []
    time.sleep(max(0.0, tat - time.time()) + 0.01)
    assert start(c1) == ["c1"]
    started = [fresh(c0).started_at, fresh(c1).started_at]
    assert started[1] - started[0] >= timedelta(milliseconds=500)


def test_a_host_limit_holds_that_hosts_calls_only(world):
    make_flow_control("acme", hosts={"127.0.0.1:9001": {"parallelism": 1}})
    a = calls(3, url=HOST_A, name="a")
    b = calls(3, url=HOST_B, name="b")
    assert start(*a, *b) == ["a0", "b0", "b1", "b2"]
    assert {fresh(row).held_queue for row in a[1:]} == {"127.0.0.1:9001"}


def test_a_tenant_without_limits_is_not_held_by_another_tenants(world):
    make_flow_control("acme", parallelism=1)
    acme = calls(3)
    globex = calls(3, "globex", name="g")
    assert start(*acme, *globex) == ["c0", "g0", "g1", "g2"]


def test_removing_the_limits_lets_the_held_calls_start(world):
    make_flow_control("acme", parallelism=1)
    rows = calls(3)
    assert start(*rows) == ["c0"]
    make_flow_control("acme")
    assert not FlowControl.objects.filter(pk="acme").exists()
    assert start(*rows[1:]) == ["c1", "c2"]
    assert held_count(tenant_id="acme") == 0


def test_changing_a_rate_keeps_its_state_and_dropping_it_forgets_it(world):
    make_flow_control("acme", rate=1, hosts={"127.0.0.1:9001": {"ratePerSecond": 1}})
    rows = calls(2)
    assert start(*rows) == ["c0"]
    control = FlowControl.objects.get(pk="acme")
    assert control.tenant_tat and set(control.host_tats) == {"127.0.0.1:9001"}
    make_flow_control("acme", rate=1, parallelism=5)
    control = FlowControl.objects.get(pk="acme")
    assert control.tenant_tat and control.host_tats == {}
    assert flow_limits_get(tenant_id="acme").as_wire() == {"parallelism": 5, "ratePerSecond": 1.0, "hosts": {}}


def test_cancelling_a_held_call_ends_its_wait(world):
    make_flow_control("acme", parallelism=1)
    c0, c1 = calls(2)
    start(c0, c1)
    time.sleep(0.02)
    cancelled = service_call_cancel(tenant_id="acme", service_call_id=c1.pk)
    assert cancelled.status == ServiceCall.Status.CANCELLED
    row = fresh(c1)
    assert row.held_since is None and row.held_ms >= 20
    assert held_count(tenant_id="acme") == 0


def test_a_retry_goes_back_to_scheduled_not_held(world):
    make_flow_control("acme", parallelism=1)
    [call] = [make_call(url=HOST_A, retry_policy={"maxAttempts": 2, "minBackoffMs": 100, "maxBackoffMs": 100})]
    start(call)
    assert service_calls_finish(results=[(CallKey("acme", call.pk, 1), HTTP_503)]) == 1
    row = fresh(call)
    assert row.status == ServiceCall.Status.SCHEDULED and row.held_since is None


def test_the_watchdog_does_not_rearm_held_calls(world):
    make_flow_control("acme", parallelism=1)
    c0, c1 = calls(2)
    start(c0, c1)
    ServiceCall.objects.filter(pk=c1.pk).update(due_at=utcnow() - timedelta(minutes=5))
    assert service_calls_rearm_overdue(due_before=utcnow() - timedelta(seconds=30)) == 0


def test_the_flow_round_picks_the_oldest_held_calls_that_fit(world):
    make_flow_control("acme", parallelism=2, hosts={"127.0.0.1:9001": {"parallelism": 1}})
    a = calls(3, url=HOST_A, name="a")
    b = calls(3, url=HOST_B, name="b")
    started = start(*a, *b)
    assert started == ["a0", "b0"]
    assert flow_round(batch=50).starts == []  # both limits full
    finish(*[row for row in (*a, *b) if row.name in started])
    # Room for 2: a1 (oldest, its host has room for 1), then b1; a2 must wait for a1's host.
    names = {row.pk: row.name for row in (*a, *b)}
    [(tenant, ids)] = flow_round(batch=50).starts
    assert tenant == "acme" and [names[pk] for pk in ids] == ["a1", "b1"]


def test_the_flow_round_waits_for_the_rate_and_says_when(world):
    make_flow_control("acme", rate=1)
    rows = calls(2)
    start(*rows)
    round_ = flow_round(batch=50)
    assert round_.held and round_.starts == []
    # Woken to admit the next call LOOKAHEAD_SECONDS before its start.
    assert round_.next_at == pytest.approx(FlowControl.objects.get(pk="acme").tenant_tat - LOOKAHEAD_SECONDS)


def test_held_ms_counts_the_wait_in_progress(world):
    make_flow_control("acme", parallelism=1)
    c0, c1 = calls(2)
    start(c0, c1)
    row = fresh(c1)
    assert held_ms_of(row, now=row.held_since + timedelta(seconds=2)) == 2000


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's EXPLAIN QUERY PLAN")
def test_the_reads_of_held_calls_use_the_held_index(world):
    make_flow_control("acme", parallelism=1)
    rows = calls(4)
    start(*rows)
    finish(rows[0])
    with recorded_queries() as queries:
        flow_round(batch=50)
        start(rows[2])
    held_reads = [
        (sql, params) for sql, params in selects_from(queries, "service_calls") if '"held_since" IS NOT NULL' in sql
    ]
    assert len(held_reads) >= 4
    for sql, params in held_reads:
        plan = " | ".join(query_plan(sql, params))
        # A SCAN of the partial index stops at its first row (LIMIT 1): only held calls are in it.
        assert "USING INDEX service_calls_held" in plan or "USING COVERING INDEX service_calls_held" in plan, plan
        assert "TEMP B-TREE" not in plan, plan


def test_a_call_admitted_ahead_of_its_rate_starts_at_its_turn(world):
    make_flow_control("acme", rate=20)
    c0, c1, c2 = calls(3)
    started = service_calls_start(keys=[CallKey("acme", c.pk) for c in (c0, c1, c2)])
    by_id = {s.service_call_id: s for s in started}
    assert set(by_id) == {c0.pk, c1.pk, c2.pk}
    first, second, third = (fresh(c).started_at for c in (c0, c1, c2))
    assert second - first == timedelta(milliseconds=50) and third - second == timedelta(milliseconds=50)
    assert by_id[c0.pk].not_before is None and by_id[c1.pk].not_before == second
    running = OutboxEvent.objects.get(aggregate_id=c1.pk, event_type="ServiceCallRunning")
    assert running.event_payload["payload"]["startedAt"] == second.isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )
