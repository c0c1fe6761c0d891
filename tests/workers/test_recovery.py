"""The watchdog after a crash: interrupt what may have been sent, run what never was."""

from datetime import timedelta

import pytest

from core.ids import utcnow
from execution.http import HttpRequest
from execution.models import HttpExecution
from execution.outcomes import Outcome
from execution.services import AttemptOrder, attempts_begin, attempts_finish
from orchestration.models import ServiceCall
from orchestration.services import service_call_start
from tests.support.factories import make_call
from workers import recovery
from workers.models import WorkerSession
from workers.services import session_start


def running_call(url="https://example.test/"):
    call = make_call(name="r", url=url, correlation_id="c")
    started = service_call_start(tenant_id="acme", service_call_id=call.pk)
    # Make it look as if it started a while ago (past the claim grace).
    ServiceCall.objects.filter(pk=call.pk).update(started_at=utcnow() - timedelta(seconds=30))
    return call, started


def order(call, started):
    return AttemptOrder(
        tenant_id="acme",
        service_call_id=call.pk,
        correlation_id="c",
        request=HttpRequest(started.method, started.url, started.headers, started.body, started.timeout_ms),
    )


def test_an_attempt_of_a_dead_worker_is_interrupted_and_never_resent(world):
    dead = session_start()
    WorkerSession.objects.filter(pk=dead.pk).update(last_heartbeat_at=utcnow() - timedelta(minutes=1))
    call, started = running_call()
    attempts_begin(orders=[order(call, started)], worker_id=dead.pk)
    executed = []
    moved = recovery.sweep(worker_id="me", execute=executed.extend)
    call.refresh_from_db()
    assert (call.status, call.error_kind) == ("Failed", "Interrupted")
    assert HttpExecution.objects.get(service_call=call).state == HttpExecution.State.INTERRUPTED
    assert executed == [] and moved == 1
    assert WorkerSession.objects.get(pk=dead.pk).status == WorkerSession.Status.UNKNOWN


def test_a_running_call_without_an_attempt_is_executed_normally(world):
    call, _ = running_call()
    executed = []
    recovery.sweep(worker_id="me", execute=executed.extend)
    assert [a.order.service_call_id for a in executed] == [call.pk]
    assert HttpExecution.objects.get(service_call=call).worker_id == "me"
    # A second sweep does not claim it again: the attempt row is the claim.
    again = []
    recovery.sweep(worker_id="other", execute=again.extend)
    assert again == []


def test_a_finished_attempt_whose_call_was_not_recorded_finishes_the_call(world):
    live = session_start()
    call, started = running_call()
    [attempt] = attempts_begin(orders=[order(call, started)], worker_id=live.pk)
    attempts_finish(results=[(attempt, Outcome(succeeded=True, status=204, latency_ms=5))])
    recovery.sweep(worker_id="me", execute=lambda _: None)
    call.refresh_from_db()
    assert call.status == "Succeeded" and call.outcome_meta["responseMeta"]["status"] == 204


def test_a_live_workers_attempt_within_its_timeout_is_left_alone(world):
    live = session_start()
    call, started = running_call()
    attempts_begin(orders=[order(call, started)], worker_id=live.pk)
    recovery.sweep(worker_id="me", execute=lambda _: None)
    call.refresh_from_db()
    assert call.status == "Running"


def test_a_stuck_attempt_past_timeout_and_grace_is_interrupted_even_if_its_worker_lives(world, settings):
    live = session_start()
    call, started = running_call()
    attempts_begin(orders=[order(call, started)], worker_id=live.pk)
    HttpExecution.objects.filter(service_call=call).update(started_at=utcnow() - timedelta(minutes=5))
    recovery.sweep(worker_id="me", execute=lambda _: None)
    call.refresh_from_db()
    assert (call.status, call.error_kind) == ("Failed", "Interrupted")


@pytest.mark.also_postgres
def test_the_event_deliveries_claimed_by_a_dead_worker_are_given_back_long_before_their_lease(world):
    """Due again once any try of the dead worker is surely over, not at the end of their lease
    (docs/events.md, "The guarantees"); a live worker's claims are left to it."""
    from delivery.models import Notification
    from delivery.services import longest_try_ms, notifications_claim, subscription_create, subscription_send_test
    from delivery.validation import SubscriptionInput

    hook, _ = subscription_create(
        tenant_id="acme", data=SubscriptionInput(kind="webhook", name="hook", url="http://127.0.0.1:9/hook")
    )
    for _ in range(2):
        subscription_send_test(tenant_id="acme", subscription_id=hook.pk)
    dead, alive = session_start(), session_start()
    WorkerSession.objects.filter(pk=dead.pk).update(last_heartbeat_at=utcnow() - timedelta(minutes=1))
    [of_the_dead] = notifications_claim(limit=1, claimed_by=dead.pk)
    [of_the_living] = notifications_claim(limit=1, claimed_by=alive.pk)

    before = utcnow()
    recovery.sweep(worker_id=alive.pk, execute=lambda attempts: None)

    given_back = Notification.objects.get(pk=of_the_dead.pk)
    surely_over = timedelta(milliseconds=longest_try_ms())
    assert (given_back.locked_until, given_back.claimed_by) == (None, None)
    assert before + surely_over <= given_back.next_attempt_at <= utcnow() + surely_over < of_the_dead.lease_until
    assert Notification.objects.get(pk=of_the_living.pk).locked_until == of_the_living.lease_until
