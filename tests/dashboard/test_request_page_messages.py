"""The request page names things as its controls do, not by the API's wire names:
"Due time must be ...", while the API keeps saying "dueAt must be ..."."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from eventservice.dashboard.forms import page_message
from orchestration.models import ServiceCall
from tests.support.api import ApiClient, calls_url, valid_payload


def _form(**overrides):
    data = {
        "name": "Year end",
        "method": "GET",
        "url": "https://billing.example.com/report",
        "body_format": "json",
        "when": "schedule",
        "idempotency_key": "dashboard-test-messages",
    }
    data.update(overrides)
    return data


def test_a_due_time_too_far_ahead_is_named_as_the_page_names_it(owner_client, world):
    too_far = (datetime.now(UTC) + timedelta(days=400)).strftime("%Y-%m-%dT%H:%M")
    response = owner_client.post("/calls/new/", _form(due_local=too_far, tz_offset="0"))
    assert response.status_code == 400
    assert response.context["form"].errors["due_local"] == ["Due time must be at most one year ahead."]
    assert "dueAt" not in response.content.decode()
    assert not ServiceCall.objects.exists()


def test_the_api_keeps_its_wire_names(world):
    too_far = (datetime.now(UTC) + timedelta(days=400)).isoformat()
    response = ApiClient(world.acme_key).post(calls_url("acme"), valid_payload(dueAt=too_far))
    assert response.status_code == 400
    assert response.json()["errors"]["dueAt"] == ["dueAt must be at most one year ahead."]


def test_only_a_leading_wire_name_is_replaced():
    assert page_message("dueAt must carry a time zone (for example 'Z').") == (
        "Due time must carry a time zone (for example 'Z')."
    )
    assert page_message("timeoutMs must be an integer from 1 to 120000.") == (
        "Timeout (ms) must be an integer from 1 to 120000."
    )
    assert page_message("A name is required.") == "A name is required."
    assert page_message("Tag 'dueAt' must be 1-64 characters.") == "Tag 'dueAt' must be 1-64 characters."
