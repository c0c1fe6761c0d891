"""'Run again' on the details page: now, or at a chosen time."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.messages import get_messages

from core.secrets import unseal_headers
from orchestration.models import ServiceCall
from tests.support.factories import HOUR, make_call, make_failed_call, make_succeeded_call


def test_it_submits_a_new_call_with_the_same_request_and_opens_it(owner_client, world):
    original = make_failed_call("acme", name="flaky", headers={"Authorization": "Bearer keep-me"}, tags=["ops"])
    response = owner_client.post(f"/calls/{original.pk}/rerun")
    rerun = ServiceCall.objects.exclude(pk=original.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/calls/{rerun.pk}/"
    assert rerun.rerun_of == original.pk
    assert rerun.status == ServiceCall.Status.SCHEDULED
    assert rerun.request_spec["url"] == original.request_spec["url"]
    assert unseal_headers(rerun.request_spec["headers"]) == {"Authorization": "Bearer keep-me"}


def test_it_needs_a_post(owner_client, world):
    call = make_call("acme", name="once", due_in=HOUR)
    assert owner_client.get(f"/calls/{call.pk}/rerun").status_code == 405
    assert ServiceCall.objects.count() == 1


def test_an_outsider_cannot_run_another_tenants_call(outsider_client, world):
    call = make_call("acme", name="private", due_in=HOUR)
    assert outsider_client.post(f"/calls/{call.pk}/rerun").status_code == 404
    assert ServiceCall.objects.count() == 1


def _messages(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_it_runs_again_at_a_chosen_time_given_in_the_browsers_zone(owner_client, world):
    original = make_failed_call("acme", name="nightly export", tags=["ops"])
    local = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0, tzinfo=None)
    # Europe/Berlin in summer: Date.getTimezoneOffset() is -120 (minutes west of UTC).
    response = owner_client.post(
        f"/calls/{original.pk}/rerun",
        {"when": "schedule", "due_local": local.isoformat(timespec="seconds"), "tz_offset": "-120"},
    )

    rerun = ServiceCall.objects.exclude(pk=original.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/calls/{rerun.pk}/"
    assert rerun.due_at == (local - timedelta(hours=2)).replace(tzinfo=UTC)
    assert rerun.status == ServiceCall.Status.SCHEDULED and rerun.rerun_of == original.pk
    due = (local - timedelta(hours=2)).strftime("%Y-%m-%d %H:%M:%S")
    assert _messages(response) == [f"Submitted again as {str(rerun.pk)[-8:]}, due {due} UTC."]


def test_the_scripts_utc_time_wins_over_the_typed_one(owner_client, world):
    original = make_call("acme", name="report", due_in=HOUR)
    due = (datetime.now(UTC) + timedelta(hours=5)).replace(microsecond=0)
    owner_client.post(
        f"/calls/{original.pk}/rerun",
        {"when": "schedule", "due_local": "2001-01-01T00:00", "due_at": due.isoformat(), "tz_offset": "0"},
    )
    assert ServiceCall.objects.exclude(pk=original.pk).get().due_at == due


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"due_at": "in-400-days"}, "Due time must be at most one year ahead."),
        ({"due_at": "2030-01-31T09:30:00"}, "Due time must carry a time zone (for example 'Z' or '+02:00')."),
        ({"due_local": "next tuesday"}, "Give the date and time as YYYY-MM-DDTHH:MM."),
        ({}, "Choose the date and time to run the call."),
    ],
)
def test_a_bad_time_is_said_in_the_pages_words_and_nothing_is_stored(owner_client, world, fields, message):
    original = make_call("acme", name="report", due_in=HOUR)
    if fields.get("due_at") == "in-400-days":
        fields = {"due_at": (datetime.now(UTC) + timedelta(days=400)).isoformat()}

    response = owner_client.post(f"/calls/{original.pk}/rerun", {"when": "schedule", **fields})

    assert response.status_code == 302 and response["Location"] == f"/calls/{original.pk}/"
    assert _messages(response) == [message]
    assert ServiceCall.objects.count() == 1
    page = owner_client.get(response["Location"]).content.decode()
    assert "dueAt" not in page


def test_a_time_long_past_is_said_and_one_just_past_runs_it_now(owner_client, world):
    """As New request: a time more than a minute ago would run it at once, which Run again does."""
    original = make_call("acme", name="report", due_in=HOUR)
    response = owner_client.post(f"/calls/{original.pk}/rerun", {"when": "schedule", "due_at": "2020-01-01T00:00:00Z"})
    (said,) = _messages(response)
    assert said.endswith("ago: the call would run at once. Choose a later time, or use Run again.")
    assert ServiceCall.objects.count() == 1
    just = (datetime.now(UTC) - timedelta(seconds=20)).isoformat()
    owner_client.post(f"/calls/{original.pk}/rerun", {"when": "schedule", "due_at": just})
    rerun = ServiceCall.objects.exclude(pk=original.pk).get()
    assert rerun.due_at == rerun.submitted_at


def test_the_details_page_offers_now_or_a_chosen_time(owner_client, world):
    call = make_succeeded_call("acme", name="report")  # (one that never ran is not run "again")
    html = owner_client.get(f"/calls/{call.pk}/").content.decode()
    assert html.count(f'action="/calls/{call.pk}/rerun"') == 2
    assert '<input type="hidden" name="when" value="now">' in html
    assert '<input type="hidden" name="when" value="schedule">' in html
    assert 'type="datetime-local" name="due_local"' in html
