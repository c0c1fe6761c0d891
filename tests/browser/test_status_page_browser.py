"""In a real browser: the status page follows calls live (status and outcome), stars,
favorites, tag and due-date filters."""

import re
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import expect

from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall, ServiceCallTag
from tests.browser.conftest import BROWSER_ZONE, log_in, screenshot
from tests.support.factories import HOUR, make_call, make_failed_call, make_finished_call, make_succeeded_call

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
    # The outcome column follows too: the HTTP status and the latency.
    expect(row.locator(".outcome-cell .outcome")).to_have_text("200")
    expect(row.locator(".outcome-cell .latency")).to_have_text(re.compile(r"^\d+ ms$"))
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


def test_the_failed_filter_shows_why_each_call_failed(page, world):
    make_succeeded_call("acme", name="Healthy sync")
    make_failed_call("acme", name="Billing push")
    make_finished_call(
        "acme", name="Slow report", outcome=Outcome.failure(ErrorKind.TIMEOUT, "No answer.", latency_ms=5000)
    )
    log_in(page, "owner", "pw-owner-123")
    page.locator("label.chip-failed").click()
    page.get_by_role("button", name="Apply filters").click()
    page.wait_for_url(re.compile(r"status=Failed"))

    rows = page.locator("table.calls tbody tr[data-id]")
    expect(rows).to_have_count(2)
    expect(page.locator("table.calls thead")).to_contain_text("Outcome")
    expect(rows.filter(has_text="Billing push").locator(".outcome-cell")).to_have_text("HttpError 503 17 ms")
    expect(rows.filter(has_text="Slow report").locator(".outcome-cell")).to_have_text("Timeout 5.00 s")
    screenshot(page, "status-page-failed-outcomes")


def test_the_due_date_filter_lives_in_the_url_and_a_bad_date_is_a_form_error(page, world):
    soon = datetime.combine(datetime.now(UTC).date() + timedelta(days=2), time(12), tzinfo=UTC)
    make_call("acme", name="Due soon", due_at=soon)
    make_call("acme", name="Due later", due_at=soon + timedelta(days=3))
    log_in(page, "owner", "pw-owner-123")

    page.get_by_label("Due from").fill(str(soon.date() + timedelta(days=1)))
    page.get_by_role("button", name="Apply filters").click()
    page.wait_for_url(re.compile(r"dueFrom=" + str(soon.date() + timedelta(days=1))))
    rows = page.locator("table.calls tbody tr[data-id]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("Due later")

    page.goto("/calls/?dueTo=not-a-date")
    expect(page.locator("#filter-errors")).to_contain_text("Due to:")
    expect(page.locator("#filter-errors")).not_to_contain_text("dueTo")
    expect(rows).to_have_count(0)
    screenshot(page, "status-page-bad-due-date")
