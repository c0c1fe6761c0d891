"""POST /api/tenants/{tenantId}/service-calls/{id}/rerun: a new call with the same request, due now
or at an optional dueAt checked as a submission's."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from core.secrets import unseal_headers
from orchestration.models import ServiceCall
from tests.support.api import assert_problem, call_url, calls_url, stored_counts, submit_via_api, valid_payload
from timer.models import TimerSchedule


def test_it_submits_a_new_call_with_the_same_request_and_answers_202(acme_api):
    original = submit_via_api(
        acme_api, tags=["billing", "favorite"], spec={"headers": {"Authorization": "Bearer secret-1", "X-Trace": "t"}}
    )

    response = acme_api.post(call_url(original["serviceCallId"], suffix="/rerun"))

    assert response.status_code == 202
    body = response.json()
    assert body["serviceCallId"] != original["serviceCallId"]
    assert response["Location"] == body["links"]["self"]
    assert body["links"]["rerunOf"] == original["links"]["self"]
    assert body["requestSpec"] == original["requestSpec"]
    assert body["tags"] == ["billing"] and body["status"] == "Scheduled"
    new = ServiceCall.objects.get(pk=body["serviceCallId"])
    assert str(new.rerun_of) == original["serviceCallId"]
    # The secret itself is carried over (sealed), so the rerun sends what the original sent.
    assert unseal_headers(new.request_spec["headers"])["Authorization"] == "Bearer secret-1"
    assert ServiceCall.objects.count() == 2


def test_rerun_of_an_unknown_call_is_404_and_stores_nothing(acme_api, world):
    before = stored_counts()
    assert_problem(acme_api.post(call_url("0190a000-0000-7000-8000-000000000000", suffix="/rerun")), 404)
    assert_problem(acme_api.post(call_url("bogus", suffix="/rerun")), 404)
    assert stored_counts() == before


def _rerun_url(call: dict) -> str:
    return call_url(call["serviceCallId"], suffix="/rerun")


def test_a_due_time_in_the_body_schedules_the_new_call_then(acme_api):
    original = submit_via_api(acme_api)
    due = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=250000)

    response = acme_api.post(_rerun_url(original), {"dueAt": due.isoformat()})

    assert response.status_code == 202, response.content
    body = response.json()
    assert body["dueAt"] == due.strftime("%Y-%m-%dT%H:%M:%S.250Z") and body["status"] == "Scheduled"
    new = ServiceCall.objects.get(pk=body["serviceCallId"])
    assert new.due_at == due and str(new.rerun_of) == original["serviceCallId"]
    assert TimerSchedule.objects.get(service_call=new).due_at == due


@pytest.mark.parametrize("due", [None, "past", "absent"])
def test_a_past_null_or_absent_due_time_means_now(acme_api, due):
    original = submit_via_api(acme_api)
    payload = {} if due == "absent" else {"dueAt": "2020-01-01T00:00:00Z" if due == "past" else None}

    response = acme_api.post(_rerun_url(original), payload)

    assert response.status_code == 202, response.content
    new = ServiceCall.objects.get(pk=response.json()["serviceCallId"])
    assert new.due_at == new.submitted_at
    # A past time is said (docs/api.md): the call is kept, due now.
    warned = response.headers.get("Warning")
    assert warned == (
        '299 - "dueAt 2020-01-01T00:00:00.000Z is in the past: the call is due now."' if due == "past" else None
    )


@pytest.mark.parametrize(
    "due",
    [
        "in-400-days",
        "tomorrow",
        "2030-01-31T09:30:00",  # no time zone
        "2030-01-31T09:30:00Z\u0000",
        "",  # the schema's date-time: leave it out, or null, for now
        12345,
        ["2030-01-31T09:30:00Z"],
    ],
)
def test_a_bad_due_time_gets_the_submissions_own_messages_and_stores_nothing(acme_api, due):
    if due == "in-400-days":
        due = (datetime.now(UTC) + timedelta(days=400)).isoformat()
    original = submit_via_api(acme_api)
    submitted = assert_problem(acme_api.post(calls_url(), valid_payload(dueAt=due)), 400, errors_for="dueAt")
    before = stored_counts()

    body = assert_problem(acme_api.post(_rerun_url(original), {"dueAt": due}), 400, errors_for="dueAt")

    assert body["errors"] == {"dueAt": submitted["errors"]["dueAt"]}
    assert body["type"] == "urn:service-agent:problem:validation-error"
    assert stored_counts() == before


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"dueAt": None, "name": "renamed"}, "Unknown fields: name."),
        ({"requestSpec": {"url": "http://127.0.0.1:9/other"}}, "Unknown fields: requestSpec."),
        ([], "The request body must be a JSON object."),
        ("2030-01-31T09:30:00Z", "The request body must be a JSON object."),
        (None, "The request body must be a JSON object."),
    ],
)
def test_other_fields_or_a_body_that_is_not_an_object_are_refused(acme_api, payload, message):
    original = submit_via_api(acme_api)
    before = stored_counts()

    raw = json.dumps(payload).encode()
    body = assert_problem(acme_api.post(_rerun_url(original), raw=raw), 400, errors_for="body")

    assert body["errors"]["body"] == [message]
    assert stored_counts() == before


def test_another_tenants_call_is_404_whatever_the_body(acme_api, globex_api):
    theirs = submit_via_api(globex_api, tenant="globex")
    before = stored_counts()
    due = (datetime.now(UTC) + timedelta(hours=1)).isoformat()

    assert_problem(acme_api.post(call_url(theirs["serviceCallId"], suffix="/rerun"), {"dueAt": due}), 404)
    assert_problem(acme_api.post(call_url(theirs["serviceCallId"], tenant="globex", suffix="/rerun")), 404)
    assert stored_counts() == before


def test_an_empty_form_post_still_runs_it_again_now_and_form_fields_get_the_same_checks(acme_api):
    original = submit_via_api(acme_api)
    headers = {"Authorization": f"Bearer {acme_api.key}"}

    response = acme_api.client.post(_rerun_url(original), headers=headers)  # an empty multipart body

    assert response.status_code == 202, response.content
    new = ServiceCall.objects.get(pk=response.json()["serviceCallId"])
    assert new.due_at == new.submitted_at
    before = stored_counts()
    body = assert_problem(acme_api.client.post(_rerun_url(original), {"url": "x"}, headers=headers), 400)
    assert body["errors"] == {"body": ["Unknown fields: url."]}
    assert stored_counts() == before
