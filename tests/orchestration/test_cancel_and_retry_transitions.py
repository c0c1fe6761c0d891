"""Cancel and retry as transitions (docs/retries.md): conditional, with their events and
timers, and harmless when repeated or stale."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.errors import Conflict, NotFound
from core.ids import utcnow
from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall
from orchestration.services import (
    CallKey,
    service_call_cancel,
    service_call_start,
    service_calls_finish,
    service_calls_rearm_overdue,
)
from outbox.models import OutboxEvent
from tests.support.factories import HOUR, make_call, make_failed_call
from timer.models import TimerSchedule

RETRYING = {"maxAttempts": 3, "minBackoffMs": 2000, "maxBackoffMs": 4000}
HTTP_503 = Outcome.failure(ErrorKind.HTTP_ERROR, "503", status=503, latency_ms=5)


def events(call):
    rows = OutboxEvent.objects.filter(aggregate_id=call.pk).order_by("id")
    return [(row.event_type, row.event_payload["payload"]) for row in rows]


def test_cancel_turns_a_scheduled_call_cancelled_once_and_drops_its_timer(world):
    call = make_call(due_in=HOUR)
    cancelled = service_call_cancel(tenant_id="acme", service_call_id=call.pk, correlation_id="c-1")
    assert cancelled.status == ServiceCall.Status.CANCELLED and cancelled.finished_at is not None
    assert not TimerSchedule.objects.filter(service_call_id=call.pk).exists()
    again = service_call_cancel(tenant_id="acme", service_call_id=call.pk)
    assert again.status == ServiceCall.Status.CANCELLED and again.finished_at == cancelled.finished_at
    types = [t for t, _ in events(call)]
    assert types == ["ServiceCallSubmitted", "ServiceCallScheduled", "ServiceCallCancelled"]
    # A timer a worker still holds fires into a start that finds nothing to start.
    assert service_call_start(tenant_id="acme", service_call_id=call.pk) is None


def test_cancel_refuses_running_and_finished_calls_naming_their_status(world):
    running = make_call()
    assert service_call_start(tenant_id="acme", service_call_id=running.pk) is not None
    failed = make_failed_call()
    for call, status in ((running, "Running"), (failed, "Failed")):
        with pytest.raises(Conflict, match=f"is {status}; only a Scheduled call can be cancelled"):
            service_call_cancel(tenant_id="acme", service_call_id=call.pk)
        assert ServiceCall.objects.get(pk=call.pk).status == status


def test_cancel_of_another_tenants_call_is_not_found_and_changes_nothing(world):
    call = make_call("globex", due_in=HOUR)
    with pytest.raises(NotFound):
        service_call_cancel(tenant_id="acme", service_call_id=call.pk)
    assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.SCHEDULED


def test_a_retryable_failure_schedules_the_next_attempt_with_a_new_timer(world):
    call = make_call(retry_policy=RETRYING)
    started = service_call_start(tenant_id="acme", service_call_id=call.pk)
    assert started.attempt == 1
    old_timer = TimerSchedule.objects.get(service_call_id=call.pk)
    before = utcnow()
    assert service_calls_finish(results=[(started.key, HTTP_503)]) == 1

    call.refresh_from_db()
    assert call.status == ServiceCall.Status.SCHEDULED and call.attempts == 1
    assert call.started_at is None and call.error_kind is None
    assert before + timedelta(milliseconds=2000) <= call.due_at <= utcnow() + timedelta(milliseconds=2200)
    assert call.outcome_meta["errorMeta"]["status"] == 503
    timer = TimerSchedule.objects.get(service_call_id=call.pk)
    assert timer.id > old_timer.id and timer.state == TimerSchedule.State.SCHEDULED and timer.due_at == call.due_at
    kind, payload = events(call)[-1]
    assert kind == "ServiceCallRetryScheduled"
    assert payload["attempt"] == 1 and payload["lastError"]["status"] == 503 and payload["nextAttemptAt"]


def test_the_last_attempt_fails_the_call_and_stale_outcomes_change_nothing(world):
    call = make_call(retry_policy={**RETRYING, "maxAttempts": 2, "minBackoffMs": 100, "maxBackoffMs": 100})
    first = service_call_start(tenant_id="acme", service_call_id=call.pk)
    service_calls_finish(results=[(first.key, HTTP_503)])
    ServiceCall.objects.filter(pk=call.pk).update(due_at=utcnow())  # due now, for the test
    second = service_call_start(tenant_id="acme", service_call_id=call.pk)
    assert second.attempt == 2
    # The first attempt's outcome arriving again (a duplicate) moves nothing.
    assert service_calls_finish(results=[(CallKey("acme", call.pk, 1), Outcome(succeeded=True, status=200))]) == 0
    assert service_calls_finish(results=[(second.key, HTTP_503)]) == 1
    call.refresh_from_db()
    assert call.status == ServiceCall.Status.FAILED and call.attempts == 2 and call.error_kind == "HttpError"
    assert [(t, p.get("attempt")) for t, p in events(call)] == [
        ("ServiceCallSubmitted", None),
        ("ServiceCallScheduled", None),
        ("ServiceCallRunning", 1),
        ("ServiceCallRetryScheduled", 1),
        ("ServiceCallRunning", 2),
        ("ServiceCallFailed", 2),
    ]


@pytest.mark.parametrize(("retry_interrupted", "status"), [(False, "Failed"), (True, "Scheduled")])
def test_interrupted_is_retried_only_when_the_policy_says_so(world, retry_interrupted, status):
    call = make_call(retry_policy={**RETRYING, "retryInterrupted": retry_interrupted})
    started = service_call_start(tenant_id="acme", service_call_id=call.pk)
    service_calls_finish(results=[(started.key, Outcome.failure(ErrorKind.INTERRUPTED, "worker died"))])
    assert ServiceCall.objects.get(pk=call.pk).status == status


def test_a_4xx_is_final_whatever_the_policy(world):
    call = make_call(retry_policy={**RETRYING, "maxAttempts": 20})
    started = service_call_start(tenant_id="acme", service_call_id=call.pk)
    service_calls_finish(results=[(started.key, Outcome.failure(ErrorKind.HTTP_ERROR, "404", status=404))])
    assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.FAILED


def test_an_overdue_scheduled_call_without_a_pending_timer_gets_one_again(world):
    stuck = make_call(due_in=HOUR)
    healthy = make_call(due_in=HOUR)
    long_ago = utcnow() - timedelta(minutes=5)
    ServiceCall.objects.filter(pk__in=[stuck.pk, healthy.pk]).update(due_at=long_ago)
    TimerSchedule.objects.filter(service_call_id=stuck.pk).update(state="Reached", reached_at=long_ago)
    healthy_timer = TimerSchedule.objects.get(service_call_id=healthy.pk).id
    assert service_calls_rearm_overdue(due_before=utcnow() - timedelta(seconds=30)) == 1
    timer = TimerSchedule.objects.get(service_call_id=stuck.pk)
    assert timer.state == TimerSchedule.State.SCHEDULED and timer.due_at == long_ago
    assert TimerSchedule.objects.get(service_call_id=healthy.pk).id == healthy_timer
    assert service_calls_rearm_overdue(due_before=utcnow() - timedelta(seconds=30)) == 0


def test_a_rerun_keeps_the_retry_policy(world):
    from orchestration.services import service_call_rerun

    original = make_failed_call(retry_policy={**RETRYING, "maxAttempts": 1})
    copy = service_call_rerun(tenant_id="acme", service_call_id=original.pk, correlation_id="c")
    assert (
        copy.retry_policy
        == original.retry_policy
        == {
            "maxAttempts": 1,
            "minBackoffMs": 2000,
            "maxBackoffMs": 4000,
            "retryOn": ["HttpError5xx", "Http429", "Timeout", "NetworkError", "CredentialError"],
            "retryInterrupted": False,
        }
    )
