"""The attempt row is the claim to send (docs/retries.md, "At most once per attempt"): the
insert that makes it is skipped for an attempt someone else already claimed, and the caller
gets back only the attempts it owns, whatever the mix and size of its batch."""

import pytest
from django.db import connection

from execution.http import HttpRequest
from execution.models import HttpExecution
from execution.services import AttemptOrder, attempts_begin
from orchestration.services import service_call_start
from tests.support.factories import make_call


def started_orders(count: int) -> list[AttemptOrder]:
    orders = []
    for n in range(count):
        call = make_call(name=f"c{n}", url="https://example.test/", correlation_id=f"c{n}")
        started = service_call_start(tenant_id="acme", service_call_id=call.pk)
        orders.append(
            AttemptOrder(
                tenant_id="acme",
                service_call_id=call.pk,
                correlation_id=f"c{n}",
                request=HttpRequest(started.method, started.url, started.headers, started.body, started.timeout_ms),
            )
        )
    return orders


@pytest.fixture(params=["returning", "no-returning"])
def database(request, monkeypatch):
    """As the database is (INSERT ... RETURNING), and as an SQLite before 3.35 would be."""
    if request.param == "no-returning":
        monkeypatch.setattr(type(connection.features), "can_return_rows_from_bulk_insert", False)


def test_a_second_claim_of_the_same_attempts_gets_none_of_them(world, database):
    orders = started_orders(3)

    first = attempts_begin(orders=orders, worker_id="worker-a")
    second = attempts_begin(orders=orders, worker_id="worker-b")

    assert [attempt.order for attempt in first] == orders and second == []
    rows = HttpExecution.objects.filter(service_call_id__in=[order.service_call_id for order in orders])
    assert sorted(rows.values_list("worker_id", flat=True)) == ["worker-a"] * 3
    assert {row.execution_id for row in rows} == {attempt.execution_id for attempt in first}


def test_a_batch_gets_back_exactly_the_attempts_nobody_had_claimed_across_statements(world, database):
    # More than one INSERT's worth of rows (core.db.INSERT_MAX_ROWS, fewer on SQLite: its limit of
    # parameters), some of them claimed already by another worker.
    orders = started_orders(120)
    taken = attempts_begin(orders=orders[5:115:11], worker_id="worker-a")

    mine = attempts_begin(orders=orders, worker_id="worker-b")

    taken_calls = {attempt.order.service_call_id for attempt in taken}
    assert len(taken_calls) == 10
    assert [attempt.order for attempt in mine] == [o for o in orders if o.service_call_id not in taken_calls]
    assert HttpExecution.objects.filter(worker_id="worker-b").count() == 110
    assert HttpExecution.objects.filter(worker_id="worker-a").count() == 10
