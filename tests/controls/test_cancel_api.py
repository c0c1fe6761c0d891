"""POST /api/tenants/{t}/service-calls/{id}/cancel (docs/retries.md, 'Cancel'): a Scheduled call
turns Cancelled once; Running and finished calls answer 409 naming their status; unknown,
malformed and other tenants' ids answer 404; and nothing changes unless the answer is 200."""

from __future__ import annotations

import pytest

from execution.models import HttpExecution
from orchestration.models import ServiceCall
from orchestration.services import CallKey, service_call_start
from outbox.models import OutboxEvent
from tests.support.api import assert_problem, call_url, session_api, stored_counts, submit_via_api
from tests.support.factories import HOUR, make_call, make_failed_call, make_succeeded_call
from timer.models import TimerSchedule
from workers.pipeline import run_now

UNKNOWN_CALL = "0190a000-0000-7000-8000-000000000000"


def _state(call_id) -> tuple:
    """Everything a cancel could change about one call, and the totals around it."""
    row = ServiceCall.objects.filter(pk=call_id).values(
        "status", "finished_at", "started_at", "due_at", "attempts", "outcome_meta", "error_kind"
    )
    events = list(OutboxEvent.objects.filter(aggregate_id=call_id).values_list("event_type", flat=True))
    timers = list(TimerSchedule.objects.filter(service_call_id=call_id).values_list("state", "due_at"))
    return list(row), events, timers, stored_counts(), HttpExecution.objects.count()


def _cancelled_events(call_id) -> list[OutboxEvent]:
    return list(OutboxEvent.objects.filter(aggregate_id=call_id, event_type=OutboxEvent.Type.CANCELLED))


def test_it_cancels_a_scheduled_call_discards_its_timer_and_appends_one_event(acme_api):
    call = submit_via_api(acme_api, dueAt=None, retryPolicy={"maxAttempts": 3})
    call_id = call["serviceCallId"]
    assert TimerSchedule.objects.filter(service_call_id=call_id).count() == 1

    response = acme_api.post(call_url(call_id, suffix="/cancel"), headers={"X-Correlation-Id": "cancel-1"})

    assert response.status_code == 200, response.content
    shown = response.json()
    assert shown["status"] == "Cancelled"
    assert shown["finishedAt"] is not None and shown["startedAt"] is None
    assert (shown["attempt"], shown["nextAttemptAt"], shown["lastError"], shown["outcome"]) == (0, None, None, None)
    assert shown["links"]["cancel"] == shown["links"]["self"] + "/cancel"
    stored = ServiceCall.objects.get(pk=call_id)
    assert stored.status == ServiceCall.Status.CANCELLED and stored.finished_at is not None
    assert not TimerSchedule.objects.filter(service_call_id=call_id).exists()
    [event] = _cancelled_events(call_id)
    envelope = event.event_payload
    assert envelope["payload"] == {"serviceCallId": call_id, "cancelledAt": shown["finishedAt"], "attempt": 0}
    assert envelope["causationId"] == "cancel-1"
    # It never starts: a start now finds nothing to start.
    assert service_call_start(tenant_id="acme", service_call_id=stored.pk) is None


def test_a_second_cancel_answers_200_again_and_changes_nothing(acme_api):
    call_id = submit_via_api(acme_api)["serviceCallId"]
    first = acme_api.post(call_url(call_id, suffix="/cancel"))
    assert first.status_code == 200, first.content
    after_first = _state(call_id)

    second = acme_api.post(call_url(call_id, suffix="/cancel"))

    assert second.status_code == 200, second.content
    assert second.json() == first.json()
    assert _state(call_id) == after_first
    assert len(_cancelled_events(call_id)) == 1


@pytest.mark.parametrize(
    ("make", "status"),
    [
        (lambda: _running_call(), "Running"),
        (lambda: make_succeeded_call("acme"), "Succeeded"),
        (lambda: make_failed_call("acme"), "Failed"),
    ],
    ids=["Running", "Succeeded", "Failed"],
)
def test_it_refuses_a_running_or_finished_call_with_409_naming_the_status(acme_api, make, status):
    call = make()
    before = _state(call.pk)

    response = acme_api.post(call_url(call.pk, suffix="/cancel"))

    body = assert_problem(response, 409)
    assert body["type"] == "urn:service-agent:problem:conflict"
    assert status in body["detail"]
    assert _state(call.pk) == before
    assert ServiceCall.objects.get(pk=call.pk).status == status


def _running_call() -> ServiceCall:
    call = make_call("acme")
    assert service_call_start(tenant_id="acme", service_call_id=call.pk) is not None
    return call


@pytest.mark.parametrize("raw_id", [UNKNOWN_CALL, "not-a-uuid", "1", "0190a000-0000-7000-8000-00000000000z"])
def test_an_unknown_or_malformed_id_is_404_and_nothing_changes(acme_api, raw_id):
    scheduled = make_call("acme", due_in=HOUR)
    before = _state(scheduled.pk)

    response = acme_api.post(call_url(raw_id, suffix="/cancel"))

    assert_problem(response, 404)
    assert _state(scheduled.pk) == before


def test_another_tenants_call_is_404_by_either_path_and_stays_scheduled(globex_api, world):
    acme_call = make_call("acme", due_in=HOUR)
    before = _state(acme_call.pk)

    on_acme_path = globex_api.post(call_url(acme_call.pk, "acme", "/cancel"))
    on_own_path = globex_api.post(call_url(acme_call.pk, "globex", "/cancel"))
    by_outsider = session_api(world.outsider).post(call_url(acme_call.pk, "acme", "/cancel"))
    by_staff = session_api(world.staff_globex).post(call_url(acme_call.pk, "acme", "/cancel"))

    for response in (on_acme_path, on_own_path, by_outsider, by_staff):
        assert_problem(response, 404)
    # On its own path the answer is that of an id that does not exist: nothing names acme.
    assert "acme" not in assert_problem(on_own_path, 404)["detail"]
    assert _state(acme_call.pk) == before
    assert ServiceCall.objects.get(pk=acme_call.pk).status == ServiceCall.Status.SCHEDULED


def test_no_credentials_is_401_and_a_member_session_may_cancel(anonymous_api, world):
    call = make_call("acme", due_in=HOUR)
    before = _state(call.pk)

    assert_problem(anonymous_api.post(call_url(call.pk, suffix="/cancel")), 401)
    assert _state(call.pk) == before

    response = session_api(world.member).post(call_url(call.pk, suffix="/cancel"))
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "Cancelled"


def test_a_call_waiting_for_its_retry_can_be_cancelled_and_is_never_sent_again(transactional_db, acme_api, flaky):
    policy = {"maxAttempts": 5, "minBackoffMs": 3_600_000, "maxBackoffMs": 3_600_000}
    call = make_call("acme", url=flaky.url(503), retry_policy=policy)
    run_now([CallKey("acme", call.pk)], worker_id="test-cancel")

    waiting = acme_api.get(call_url(call.pk)).json()
    assert (waiting["status"], waiting["attempt"]) == ("Scheduled", 1)
    assert waiting["nextAttemptAt"] == waiting["dueAt"]
    assert waiting["lastError"]["kind"] == "HttpError" and waiting["lastError"]["status"] == 503
    assert waiting["outcome"] is None

    response = acme_api.post(call_url(call.pk, suffix="/cancel"))

    assert response.status_code == 200, response.content
    shown = response.json()
    assert (shown["status"], shown["attempt"], shown["nextAttemptAt"]) == ("Cancelled", 1, None)
    [event] = _cancelled_events(call.pk)
    assert event.event_payload["payload"]["attempt"] == 1
    assert not TimerSchedule.objects.filter(service_call_id=call.pk).exists()
    assert run_now([CallKey("acme", call.pk)], worker_id="test-cancel") == 0
    assert [a.attempt for a in flaky.of(call.pk)] == ["1"]


def test_a_cancelled_call_shows_no_outcome_even_after_a_failed_attempt(transactional_db, acme_api, flaky):
    """The API's contract: `outcome` is null when Cancelled (ServiceCallSerializer.outcome). The
    failed first attempt was the retry's `lastError`, not an outcome of the call."""
    policy = {"maxAttempts": 5, "minBackoffMs": 3_600_000, "maxBackoffMs": 3_600_000}
    call = make_call("acme", url=flaky.url(503), retry_policy=policy)
    run_now([CallKey("acme", call.pk)], worker_id="test-cancel")

    shown = acme_api.post(call_url(call.pk, suffix="/cancel")).json()

    assert shown["status"] == "Cancelled"
    assert shown["outcome"] is None, shown["outcome"]
