"""The calls page's ?status= filter: any letter case, and a refusal that names the valid
statuses (the FilterSet is the API's, orchestration.filters)."""

from __future__ import annotations

from orchestration.models import ServiceCall
from tests.support.factories import make_call

VALID = "status must be one of: Scheduled, Running, Succeeded, Failed"


def test_the_calls_page_names_the_valid_statuses(owner_client, world):
    response = owner_client.get("/calls/?status=done")
    assert VALID in response.content.decode()
    assert "Select a valid choice" not in response.content.decode()


def test_the_calls_page_accepts_a_status_in_lower_case(owner_client, world):
    scheduled = make_call("acme", name="Later report", due_in=3600)
    assert scheduled.status == ServiceCall.Status.SCHEDULED
    html = owner_client.get("/calls/?status=scheduled").content.decode()
    assert VALID not in html
    assert "Later report" in html
    assert "Later report" not in owner_client.get("/calls/?status=failed").content.decode()


def test_a_lower_case_status_ticks_its_checkbox(owner_client, world):
    response = owner_client.get("/calls/?status=failed")
    assert response.context["selected_statuses"] == ["Failed"]
