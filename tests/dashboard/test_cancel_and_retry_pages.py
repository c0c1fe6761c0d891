"""Cancel and retries on the pages (docs/retries.md): the Cancel control and its endpoint, the
request page's retry policy, and what a call waiting for its next attempt shows."""

from __future__ import annotations

import uuid

from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall
from orchestration.services import service_call_start, service_calls_finish
from outbox.models import OutboxEvent
from tests.dashboard.test_request_page import _form
from tests.support.factories import HOUR, make_call, make_succeeded_call

POLICY = {"maxAttempts": 3, "minBackoffMs": 60_000, "maxBackoffMs": 120_000}


def test_the_status_and_details_pages_offer_cancel_only_for_scheduled_calls(owner_client, world):
    waiting = make_call(name="waiting", due_in=HOUR)
    done = make_succeeded_call(name="done")
    listing = owner_client.get("/calls/").content.decode()
    assert listing.count('class="cancel-confirm row-cancel"') == 1
    assert f"/calls/{waiting.pk}/cancel" in listing and f"/calls/{done.pk}/cancel" not in listing
    assert f"/calls/{waiting.pk}/cancel" in owner_client.get(f"/calls/{waiting.pk}/").content.decode()
    assert "/cancel" not in owner_client.get(f"/calls/{done.pk}/").content.decode()


def test_cancel_from_the_status_page_returns_to_it_with_a_message(owner_client, world):
    waiting = make_call(name="waiting", due_in=HOUR)
    response = owner_client.post(f"/calls/{waiting.pk}/cancel", {"next": "/calls/?status=Scheduled"}, follow=True)
    assert response.redirect_chain[-1][0] == "/calls/?status=Scheduled"
    assert "it will not run" in response.content.decode()
    assert ServiceCall.objects.get(pk=waiting.pk).status == "Cancelled"
    page = owner_client.get(f"/calls/{waiting.pk}/").content.decode()
    assert "it never ran" in page and "/cancel" not in page


def test_cancel_of_a_started_call_says_why_and_changes_nothing(owner_client, world):
    done = make_succeeded_call(name="done")
    response = owner_client.post(f"/calls/{done.pk}/cancel", follow=True)
    assert "Not cancelled: the call is Succeeded already" in response.content.decode()
    assert ServiceCall.objects.get(pk=done.pk).status == "Succeeded"
    assert not OutboxEvent.objects.filter(aggregate_id=done.pk, event_type="ServiceCallCancelled").exists()


def test_cancel_is_post_only_and_tenant_scoped(owner_client, world):
    theirs = make_call("globex", due_in=HOUR)
    assert owner_client.get(f"/calls/{theirs.pk}/cancel").status_code == 405
    assert owner_client.post(f"/calls/{uuid.uuid4()}/cancel").status_code == 404
    owner_client.post(f"/calls/{theirs.pk}/cancel")
    assert ServiceCall.objects.get(pk=theirs.pk).status == "Scheduled"


def test_the_request_page_sends_a_retry_policy(owner_client, world):
    form = _form(
        max_attempts="4",
        min_backoff_ms="500",
        max_backoff_ms="8000",
        retry_on=["HttpError5xx", "Timeout"],
        retry_interrupted="on",
    )
    assert owner_client.post("/calls/new/", form).status_code in (200, 302)
    call = ServiceCall.objects.get()
    assert call.retry_policy == {
        "maxAttempts": 4,
        "minBackoffMs": 500,
        "maxBackoffMs": 8000,
        "retryOn": ["HttpError5xx", "Timeout"],
        "retryInterrupted": True,
    }


def test_one_attempt_sends_no_policy_and_bad_bounds_are_shown_in_the_pages_words(owner_client, world):
    owner_client.post("/calls/new/", _form(max_attempts="1", idempotency_key="k-1"))
    assert ServiceCall.objects.get().retry_policy is None
    response = owner_client.post("/calls/new/", _form(max_attempts="3", min_backoff_ms="9000", max_backoff_ms="1000"))
    html = response.content.decode()
    assert response.status_code == 400
    assert "First retry after (ms) must not be greater than the longest wait." in html
    assert "BackoffMs" not in html.split('id="min_backoff_ms-errors"')[1].split("</ul>")[0]
    assert ServiceCall.objects.count() == 1


def test_a_call_waiting_for_its_next_attempt_says_so(owner_client, world):
    call = make_call(name="flaky", retry_policy=POLICY)
    started = service_call_start(tenant_id="acme", service_call_id=call.pk)
    failure = Outcome.failure(ErrorKind.HTTP_ERROR, "The target answered 503.", status=503, latency_ms=9)
    service_calls_finish(results=[(started.key, failure)])
    page = owner_client.get(f"/calls/{call.pk}/").content.decode()
    assert "Attempt 1 of 3 failed" in page and "Next attempt (2 of 3) due" in page
    assert "1 of 3" in page and f"/calls/{call.pk}/cancel" in page
    listing = owner_client.get("/calls/").content.decode()
    assert "attempt 2 due" in listing
