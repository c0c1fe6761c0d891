"""In a real browser: Cancel asks once more and then calls off the call, from the status page
and from the details page; the request page's Advanced section sends a retry policy."""

import pytest
from playwright.sync_api import expect

from orchestration.models import ServiceCall
from tests.browser.conftest import log_in, screenshot
from tests.support.factories import HOUR, make_call

pytestmark = pytest.mark.browser


def test_cancel_needs_a_second_click_on_the_status_page(page, world):
    waiting = make_call("acme", name="Nightly export", due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    page.goto("/calls/")
    row = page.locator(f'tr[data-id="{waiting.pk}"]')
    confirm = row.get_by_role("button", name="Yes, cancel it")
    expect(confirm).to_be_hidden()
    row.get_by_label("Cancel Nightly export").click()
    expect(confirm).to_be_visible()
    screenshot(page, "status-page-cancel")
    assert ServiceCall.objects.get(pk=waiting.pk).status == "Scheduled"  # opening is not cancelling
    confirm.click()
    expect(page.locator(".messages, .message, [role=status]").first).to_contain_text("it will not run")
    expect(page.locator(f'tr[data-id="{waiting.pk}"] .badge')).to_have_text("Cancelled")
    expect(page.locator(f'tr[data-id="{waiting.pk}"] .row-cancel')).to_have_count(0)


def test_cancel_on_the_details_page(page, world):
    waiting = make_call("acme", name="Weekly report", due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    page.goto(f"/calls/{waiting.pk}/")
    page.locator("#cancel-control summary").click()
    page.get_by_role("button", name="Yes, cancel the call").click()
    expect(page.locator(".detail-head .badge")).to_have_text("Cancelled")
    expect(page.locator("#response-h + p")).to_contain_text("it never ran")
    assert ServiceCall.objects.get(pk=waiting.pk).status == "Cancelled"


def test_the_request_page_sends_a_retry_policy(page, world):
    log_in(page, "owner", "pw-owner-123")
    page.goto("/calls/new/")
    page.get_by_label("Name", exact=True).fill("With retries")
    page.get_by_label("URL", exact=True).fill("https://api.example.com/orders")
    page.locator("details.advanced summary").click()
    page.get_by_label("Attempts", exact=True).fill("5")
    page.get_by_label("First retry after (ms)").fill("2000")
    page.get_by_label("Network error").uncheck()
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#result")).to_be_visible()
    call = ServiceCall.objects.get(name="With retries")
    assert call.retry_policy["maxAttempts"] == 5 and call.retry_policy["minBackoffMs"] == 2000
    assert call.retry_policy["retryOn"] == ["HttpError5xx", "Http429", "Timeout"]


def test_every_call_the_filters_match_is_cancelled_after_a_confirm_step(page, world):
    nightly = [make_call("acme", name=f"Nightly {i}", tags=["nightly"], due_in=HOUR) for i in range(3)]
    other = make_call("acme", name="Other", due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    page.goto("/calls/?tag=nightly")
    page.locator("#bulk-actions summary").click()
    page.get_by_label("Action").select_option("cancel")
    page.get_by_role("button", name="Review…").click()
    expect(page.locator("#bulk-count")).to_contain_text("3 calls match these filters")
    screenshot(page, "calls-bulk-confirm")
    assert ServiceCall.objects.filter(status="Cancelled").count() == 0  # reviewing is not cancelling
    page.get_by_role("button", name="Cancel them").click()
    expect(page.locator(".messages")).to_contain_text("3 of 3 calls cancelled")
    assert page.url.endswith("/calls/?tag=nightly")
    assert {c.status for c in ServiceCall.objects.filter(pk__in=[c.pk for c in nightly])} == {"Cancelled"}
    assert ServiceCall.objects.get(pk=other.pk).status == "Scheduled"
