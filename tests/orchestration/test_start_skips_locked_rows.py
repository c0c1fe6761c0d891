"""The start of due calls reads and locks them with a statement built once per process
(core.db.rows_by_key). On PostgreSQL it skips a call another transaction holds locked, rather
than wait for it, and starts it once that transaction is over; on either database it starts
only what is Scheduled and due, of the tenant named in its key."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.ids import utcnow
from orchestration.models import ServiceCall
from orchestration.services import CallKey, service_calls_start
from tests.support.factories import make_call
from tests.support.locks import row_locked_elsewhere


def due_call(name: str, tenant_id: str = "acme") -> ServiceCall:
    call = make_call(tenant_id, name=name, due_in=60)
    ServiceCall.objects.filter(pk=call.pk).update(due_at=utcnow() - timedelta(seconds=1))
    return call


def test_it_starts_only_due_scheduled_calls_of_the_tenant_in_their_key(db, world):
    due, other_tenant, later = due_call("due"), due_call("globex's", "globex"), make_call(name="later", due_in=60)
    running = due_call("running")
    ServiceCall.objects.filter(pk=running.pk).update(status=ServiceCall.Status.RUNNING)

    started = service_calls_start(
        keys=[
            CallKey("acme", due.pk),
            CallKey("acme", other_tenant.pk),  # another tenant's call under acme's name
            CallKey("acme", later.pk),
            CallKey("acme", running.pk),
        ]
    )

    assert [call.service_call_id for call in started] == [due.pk]
    assert started[0].attempt == 1 and started[0].tenant_id == "acme"
    statuses = dict(ServiceCall.objects.values_list("name", "status"))
    assert statuses == {"due": "Running", "globex's": "Scheduled", "later": "Scheduled", "running": "Running"}
    assert service_calls_start(keys=[CallKey("acme", due.pk)]) == []  # started once


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_call_another_transaction_holds_is_skipped_and_started_after(world):
    call = due_call("held")
    with row_locked_elsewhere(ServiceCall, call.pk):
        assert service_calls_start(keys=[CallKey("acme", call.pk)]) == []  # skipped, not waited for
        assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.SCHEDULED
    [started] = service_calls_start(keys=[CallKey("acme", call.pk)])
    assert started.service_call_id == call.pk
    assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.RUNNING


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_backlog_skips_a_call_another_transaction_holds_and_starts_the_others_in_due_order(world):
    """The backlog's start (service_calls_start_overdue) chooses its calls with a statement
    written once per process, FOR UPDATE SKIP LOCKED: a call held elsewhere is left for later,
    the others start at once, oldest due first."""
    from orchestration.services import service_calls_start_overdue

    first, held, last = due_call("first"), due_call("held"), due_call("last")
    now = utcnow()
    for seconds, call in [(30, first), (20, held), (10, last)]:
        ServiceCall.objects.filter(pk=call.pk).update(due_at=now - timedelta(seconds=seconds))
    with row_locked_elsewhere(ServiceCall, held.pk):
        started = service_calls_start_overdue(due_before=utcnow(), limit=10)
        assert [call.service_call_id for call in started] == [first.pk, last.pk]
    [started] = service_calls_start_overdue(due_before=utcnow(), limit=10)
    assert started.service_call_id == held.pk
