"""?status= on the list (API and dashboard): any letter case, and a refusal that names the
valid statuses."""

from __future__ import annotations

from tests.support.api import calls_url, submit_via_api

VALID = "status must be one of: Scheduled, Running, Succeeded, Failed"


def test_a_status_in_any_letter_case_filters_as_its_canonical_value(acme_api):
    call_id = submit_via_api(acme_api, name="later")["serviceCallId"]
    for value in ("scheduled", "SCHEDULED", "Scheduled"):
        response = acme_api.get(f"{calls_url('acme')}?status={value}")
        assert response.status_code == 200, response.content
        assert [row["serviceCallId"] for row in response.json()["results"]] == [call_id], value
    response = acme_api.get(f"{calls_url('acme')}?status=failed")
    assert response.status_code == 200
    assert response.json()["results"] == []


def test_it_refuses_an_unknown_status_naming_the_valid_ones(acme_api):
    response = acme_api.get(f"{calls_url('acme')}?status=done")
    assert response.status_code == 400
    messages = response.json()["errors"]["status"]
    assert len(messages) == 1 and messages[0].startswith(VALID), messages
    assert "'done'" in messages[0]
    assert "Select a valid choice" not in messages[0]
