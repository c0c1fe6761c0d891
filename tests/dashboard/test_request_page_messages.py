"""The request page names things as its controls do, not by the API's wire names:
"Due time must be ...", while the API keeps saying "dueAt must be ..."."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

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


WIRE_NAME = re.compile(r"\b(requestSpec|dueAt|timeoutMs|idempotencyKey)\b")


def _errors(response) -> list[str]:
    return [message for messages in response.context["form"].errors.values() for message in messages]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '{"items": ["ok", "\\u0000"]}',
            "The body at .items[1] contains a NUL character (U+0000), which cannot be stored.",
        ),
        (
            '{"a": {"b\\u0000": 1}}',
            "A key in the body at .a contains a NUL character (U+0000), which cannot be stored.",
        ),
        ("[" * 65 + "]" * 65, "The body is nested deeper than 64 levels."),
    ],
)
def test_a_body_the_rules_refuse_is_named_as_the_page_names_it(owner_client, world, body, message):
    response = owner_client.post("/calls/new/", _form(when="now", body=body))

    assert response.status_code == 400
    assert response.context["form"].errors["body"] == [message]
    assert not WIRE_NAME.search(response.content.decode())
    assert not ServiceCall.objects.exists()


def test_a_tampered_form_key_is_not_named_by_its_wire_name(owner_client, world):
    response = owner_client.post("/calls/new/", _form(when="now", idempotency_key="k" * 300))

    assert response.status_code == 400
    assert _errors(response) == ["The form's submission key must be 1-200 characters."]
    assert not WIRE_NAME.search(response.content.decode())


def test_no_message_of_a_bad_submission_names_a_wire_field(owner_client, world):
    response = owner_client.post(
        "/calls/new/",
        _form(url="ftp://x", timeout_ms="0", due_local="2030-13-45T99:00", body='{"a": "\\u0000"}'),
    )

    assert response.status_code == 400
    assert len(_errors(response)) >= 3
    assert not [message for message in _errors(response) if WIRE_NAME.search(message)]
    assert not WIRE_NAME.search(response.content.decode())


def test_nested_wire_names_are_named_too():
    assert page_message("requestSpec.headers.X-Trace contains a NUL character (U+0000), which cannot be stored.") == (
        "Header 'X-Trace' contains a NUL character (U+0000), which cannot be stored."
    )
    assert page_message('A key in requestSpec.body["a b"] contains a NUL character.') == (
        'A key in the body at ["a b"] contains a NUL character.'
    )
    assert page_message("tags[2] contains a lone UTF-16 surrogate (U+D800): it is not valid Unicode text.") == (
        "Tag 3 contains a lone UTF-16 surrogate (U+D800): it is not valid Unicode text."
    )
    assert page_message("names are fine") == "names are fine"


def test_a_time_in_the_past_is_said_before_sending_and_sent_only_once_confirmed(owner_client, world):
    """Past means now (as the API), but the page says so first and asks to confirm."""
    response = owner_client.post("/calls/new/", _form(due_local="2020-01-01T00:00", tz_offset="0"))
    assert response.status_code == 400
    (message,) = response.context["form"].errors["due_local"]
    assert re.fullmatch(
        r"That time is [\d,]+ days ago: the call would run at once\. Choose a later time, or send it now\.", message
    )
    html = response.content.decode()
    assert 'id="send-past"' in html and 'name="past_ok"' in html
    assert not ServiceCall.objects.exists()

    sent = owner_client.post("/calls/new/", _form(due_local="2020-01-01T00:00", tz_offset="0", past_ok="true"))
    assert sent.status_code == 200
    call = ServiceCall.objects.get()
    assert call.due_at == call.submitted_at  # due at once
    # A time within the last minute is "now" without a question.
    just_now = (datetime.now(UTC) - timedelta(seconds=20)).strftime("%Y-%m-%dT%H:%M:%S")
    again = owner_client.post("/calls/new/", _form(due_local=just_now, tz_offset="0", idempotency_key="other"))
    assert again.status_code == 200 and ServiceCall.objects.count() == 2


def test_the_api_and_the_command_say_a_past_due_time(world):
    from tests.commands.cli import call

    answer = ApiClient(world.acme_key).post(calls_url("acme"), valid_payload(dueAt="2020-01-01T00:00:00Z"))
    assert answer.status_code == 202
    assert answer.headers["Warning"] == '299 - "dueAt 2020-01-01T00:00:00.000Z is in the past: the call is due now."'
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert "Warning" not in ApiClient(world.acme_key).post(calls_url("acme"), valid_payload(dueAt=later)).headers
    empty = ApiClient(world.acme_key).post(calls_url("acme"), valid_payload(dueAt=""))
    assert empty.status_code == 400 and "dueAt" in empty.json()["errors"]
    argv = ["submit_call", "--tenant=acme", "--name=late", "--method=GET", "--url=http://127.0.0.1:9/x"]
    ran = call(*argv, "--due=2020-01-01T00:00:00Z")
    assert ran.code == 0
    assert "Note: --due 2020-01-01T00:00:00.000Z is in the past: the call is due now." in ran.err


def test_enter_keeps_asking_only_the_send_it_now_button_sends_a_past_time(owner_client, world):
    """Enter submits with a form's first submit button: Submit comes before "Send it now"."""
    response = owner_client.post("/calls/new/", _form(due_local="2020-01-01T00:00", tz_offset="0"))
    html = response.content.decode()
    assert html.index('id="submit-request"') < html.index('id="send-past"')
