"""In a real browser: the details page shows the timeline and follows a call until it ends."""

import re

import pytest
from playwright.sync_api import expect

from orchestration.models import ServiceCall
from tests.browser.conftest import log_in, screenshot
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
