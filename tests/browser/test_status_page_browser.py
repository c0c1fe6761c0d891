"""In a real browser: the status page follows calls live, stars, favorites and tag filters."""

import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import expect

from orchestration.models import ServiceCall, ServiceCallTag
from tests.browser.conftest import BROWSER_ZONE, log_in, screenshot
from tests.support.factories import HOUR, make_call

pytestmark = pytest.mark.browser


def _row(page, call):
    return page.locator(f'tr[data-id="{call.pk}"]')


def test_a_call_scheduled_seconds_ahead_turns_succeeded_without_a_reload(page, world, engine, http_target):
    log_in(page, "owner", "pw-owner-123")
    page.goto("/calls/new/")
    page.get_by_label("Name", exact=True).fill("Scheduled from the browser")
    page.get_by_label("URL", exact=True).fill(http_target.url("/json"))
    page.get_by_label("Schedule").check()
    # The date and time are typed in the browser's zone (Europe/Berlin here), to the second.
    due = (datetime.now(ZoneInfo(BROWSER_ZONE)) + timedelta(seconds=5)).replace(microsecond=0)
    page.get_by_label("Date and time").fill(due.strftime("%Y-%m-%dT%H:%M:%S"))
    expect(page.locator("#due-utc")).to_contain_text("(UTC)")
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#result .badge")).to_have_text("Scheduled")

    call = ServiceCall.objects.get(tenant_id="acme")
    assert call.due_at == due  # stored in UTC: the same instant the browser meant

    page.get_by_role("link", name="Calls", exact=True).click()
    row = _row(page, call)
    expect(row.locator(".badge")).to_have_text("Scheduled")
    page.evaluate("window.__sameDocument = true")
    expect(row.locator(".badge")).to_have_text("Succeeded", timeout=9000)
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    expect(row.locator(".execution")).to_contain_text("started")
    screenshot(page, "status-page-live")
    assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.SUCCEEDED


def test_a_starred_call_is_found_under_show_favorites(page, world):
    keep = make_call("acme", name="Star this one", due_in=HOUR)
    make_call("acme", name="Leave this one", due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    star = _row(page, keep).get_by_role("button", name="Add to favorites")
    star.click()
    expect(_row(page, keep).locator("button.star")).to_have_attribute("aria-pressed", "true")
    assert ServiceCallTag.objects.filter(service_call_id=keep.pk, tag="favorite").exists()

    page.get_by_text("★ Show favorites").click()
    page.get_by_role("button", name="Apply filters").click()
    page.wait_for_url(re.compile(r"favorite=true"))
    rows = page.locator("table.calls tbody tr[data-id]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("Star this one")
    screenshot(page, "status-page-favorites")


def test_two_tag_filters_show_the_calls_carrying_both_and_live_in_the_url(page, world):
    make_call("acme", name="Billing only", tags=["billing"], due_in=HOUR)
    make_call("acme", name="Billing at night", tags=["billing", "nightly"], due_in=HOUR)
    make_call("acme", name="Nightly only", tags=["nightly"], due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    tag_input = page.get_by_label("Add a tag filter")
    tag_input.fill("billing")
    tag_input.press("Enter")
    page.wait_for_url(re.compile(r"tag=billing"))
    page.get_by_label("Add a tag filter").fill("nightly")
    page.get_by_label("Add a tag filter").press("Enter")
    page.wait_for_url(re.compile(r"tag=billing&tag=nightly"))
    rows = page.locator("table.calls tbody tr[data-id]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("Billing at night")
    expect(page.locator(".pager-range")).to_have_text("1–1 of 1")
    screenshot(page, "status-page-two-tags")

    # The URL is the view: opening it again shows the same list, and × drops one tag.
    bookmarked = page.url
    page.goto("/calls/")
    page.goto(bookmarked)
    expect(rows).to_have_count(1)
    page.get_by_role("link", name="Remove tag filter nightly").click()
    expect(rows).to_have_count(2)
