"""POST /api/tenants/{tenantId}/service-calls/{id}/rerun: a new call with the same request."""

from __future__ import annotations

from core.secrets import unseal_headers
from orchestration.models import ServiceCall
from tests.support.api import assert_problem, call_url, stored_counts, submit_via_api


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
