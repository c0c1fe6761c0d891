"""In a real browser: the details page shows the timeline and follows a call until it ends,
runs it again now or at a chosen time, and copies it into the request page."""

import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import expect

from core.secrets import unseal_headers
from orchestration.models import ServiceCall
from tests.browser.conftest import BROWSER_ZONE, log_in, screenshot
from tests.support.factories import HOUR, make_call
from tests.support.waiting import wait_for

pytestmark = pytest.mark.browser


def test_the_details_page_follows_a_call_and_shows_its_timeline(page, world, engine, http_target):
    log_in(page, "owner", "pw-owner-123")
    call = make_call(
        "acme",
        name="Fetch the order",
        url=http_target.url("/json"),
        due_in=3,
        tags=["orders"],
        headers={"Authorization": "Bearer details-secret"},
    )
    page.goto(f"/calls/{call.pk}/")
    expect(page.locator(".detail-head .badge")).to_have_text("Scheduled")
    # The page reloads itself when the status changes, until the call has finished.
    expect(page.locator(".detail-head .badge")).to_have_text("Succeeded", timeout=9000)

    steps = page.locator("ol.timeline li")
    expect(steps).to_have_count(5)
    for index, label in enumerate(["Submitted", "Scheduled", "Due", "Started", "Finished"]):
        expect(steps.nth(index).locator(".step-label")).to_have_text(label)
    expect(steps.nth(3)).to_contain_text("lateness")
    expect(steps.nth(4)).to_contain_text("latency")
    # Times are shown in the browser's zone, with UTC on hover.
    first_time = steps.nth(0).locator("time")
    expect(first_time).to_have_attribute("title", re.compile(r" UTC$"))
    assert not first_time.inner_text().endswith("UTC")

    expect(page.locator("#response-h")).to_contain_text("200")
    expect(page.get_by_text('"hello": "world"')).to_be_visible()
    expect(page.locator("table.data").first).to_contain_text("Finished")
    assert "details-secret" not in page.content()
    wait_for(lambda: page.reload() or page.locator(".pub-no").count() == 0, timeout=5)
    expect(page.locator(".pub-yes")).to_have_count(4)
    screenshot(page, "details-page")

    page.get_by_role("button", name="Run again").click()
    page.wait_for_url(re.compile(r"/calls/[0-9a-f-]{36}/$"))
    rerun = ServiceCall.objects.get(rerun_of=call.pk)
    assert str(rerun.pk) in page.url
    expect(page.locator(".detail-head .badge")).to_have_text("Succeeded", timeout=9000)


def test_tags_are_edited_on_the_details_page(page, world):
    call = make_call("acme", name="Tag me", tags=["old"], due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    page.goto(f"/calls/{call.pk}/")
    page.get_by_label("Edit tags").fill("reports weekly")
    page.get_by_role("button", name="Save tags").click()
    expect(page.locator(".messages")).to_contain_text("Tags saved.")
    expect(page.locator("#tags-h + .tag-chips .chip")).to_have_text(["reports", "weekly"])


def test_run_again_at_a_chosen_time_in_the_browsers_zone(page, world):
    call = make_call("acme", name="Monthly report", tags=["reports"], due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    page.goto(f"/calls/{call.pk}/")

    page.get_by_text("Run at a chosen time…").click()
    when = page.get_by_label("Run at")
    expect(when).to_be_focused()
    due = (datetime.now(ZoneInfo(BROWSER_ZONE)) + timedelta(days=3)).replace(microsecond=0)
    when.fill(due.strftime("%Y-%m-%dT%H:%M:%S"))
    expect(page.locator("#rerun-due-utc")).to_contain_text("(UTC)")
    screenshot(page, "details-run-at-a-chosen-time")
    when.press("Enter")  # Enter schedules; it never runs the call at once

    page.wait_for_url(re.compile(r"/calls/[0-9a-f-]{36}/$"))
    rerun = ServiceCall.objects.get(rerun_of=call.pk)
    assert str(rerun.pk) in page.url
    assert rerun.due_at == due  # the instant the browser meant, stored in UTC
    expect(page.locator(".messages")).to_contain_text("Submitted again as")
    expect(page.locator(".messages")).to_contain_text(" UTC.")
    expect(page.locator(".detail-head .badge")).to_have_text("Scheduled")


def test_a_time_more_than_a_year_ahead_is_refused_in_the_pages_words(page, world):
    call = make_call("acme", name="Yearly", due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    page.goto(f"/calls/{call.pk}/")
    page.get_by_text("Run at a chosen time…").click()
    too_far = datetime.now(ZoneInfo(BROWSER_ZONE)) + timedelta(days=400)
    page.get_by_label("Run at").fill(too_far.strftime("%Y-%m-%dT%H:%M:%S"))
    page.get_by_role("button", name="Schedule the run").click()

    expect(page.locator(".message-error")).to_have_text("Due time must be at most one year ahead.")
    assert page.url.endswith(f"/calls/{call.pk}/")
    assert ServiceCall.objects.count() == 1


def test_copy_into_a_new_request_keeps_the_request_but_never_the_secret(page, world, engine, http_target):
    call = make_call(
        "acme",
        name="Order sync",
        method="POST",
        url=http_target.url("/json"),
        headers={"Authorization": "Bearer copy-me-not", "X-Trace": "trace-7"},
        body={"order": 1042},
        tags=["orders"],
        due_in=HOUR,
    )
    log_in(page, "owner", "pw-owner-123")
    page.goto(f"/calls/{call.pk}/")
    page.get_by_role("link", name="Copy into a new request").click()
    page.wait_for_url(re.compile(r"/calls/new/\?from="))

    expect(page.get_by_label("Name", exact=True)).to_have_value("Order sync")
    expect(page.get_by_label("Method", exact=True)).to_have_value("POST")
    expect(page.get_by_label("URL", exact=True)).to_have_value(http_target.url("/json"))
    expect(page.get_by_label("Header name")).to_have_count(2)
    expect(page.get_by_label("Header name").nth(0)).to_have_value("Authorization")
    secret = page.get_by_label("Header value").nth(0)
    expect(secret).to_have_value("")
    expect(secret).to_have_attribute("type", "password")
    expect(page.get_by_label("Header value").nth(1)).to_have_value("trace-7")
    expect(page.locator("#id_body")).to_have_value('{\n  "order": 1042\n}')
    expect(page.locator("#body-status")).to_have_text("✓ Valid JSON")
    expect(page.get_by_label("Tags", exact=True)).to_have_value("orders")
    expect(page.locator("#copy-note")).to_contain_text("Secret header values are not copied")
    expect(page.locator("#copy-note")).to_contain_text("Authorization")
    assert "copy-me-not" not in page.content() and "***" not in page.content()
    screenshot(page, "request-page-copied")

    # Change it before sending: another path, the secret entered again.
    page.get_by_label("URL", exact=True).fill(http_target.url("/echo"))
    secret.fill("Bearer entered-again")
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#result .badge")).to_have_text("Succeeded", timeout=8000)

    copy = ServiceCall.objects.exclude(pk=call.pk).get()
    assert copy.request_spec["url"] == http_target.url("/echo") and copy.rerun_of is None
    assert unseal_headers(copy.request_spec["headers"]) == {
        "Authorization": "Bearer entered-again",
        "X-Trace": "trace-7",
    }
    [sent] = [r for r in http_target.requests if r["path"] == "/echo"]
    assert sent["headers"]["Authorization"] == "Bearer entered-again"
    assert ServiceCall.objects.get(pk=call.pk).request_spec["url"] == http_target.url("/json")
    assert "entered-again" not in page.content()
