"""In a real browser: create a webhook subscription on its page, see its secret once, reload and
it is gone; the pages break neither the Content-Security-Policy nor their scripts (the `page`
fixture fails the test on any console error, and a CSP refusal is one)."""

import re

import pytest
from playwright.sync_api import expect

from core.secrets import unseal_value
from delivery.models import Subscription
from tests.browser.conftest import log_in, screenshot

pytestmark = pytest.mark.browser

# Recorded in the page itself: Playwright's init scripts are not subject to the page's policy.
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline"));
});
"""


def test_a_subscription_created_in_the_browser_shows_its_secret_once(page, world):
    page.context.add_init_script(WATCH)
    log_in(page, "owner", "pw-owner-123")
    page.get_by_role("link", name="Subscriptions").click()
    expect(page.get_by_role("heading", name="Subscriptions")).to_be_visible()
    page.get_by_role("link", name="New subscription").click()

    page.get_by_label("Name", exact=True).fill("Billing system")
    page.get_by_label("URL", exact=True).fill("ftp://files.example.com/x")
    page.get_by_role("button", name="Create subscription").click()
    expect(page.locator("#url-errors")).to_contain_text("http or https")
    assert not Subscription.objects.exists()

    page.get_by_label("URL", exact=True).fill("https://hooks.example.com/service-agent")
    page.get_by_label("ServiceCallSucceeded").check()
    page.get_by_label("ServiceCallFailed").check()
    page.get_by_role("button", name="Create subscription").click()

    page.wait_for_url(re.compile(r".*/subscriptions/[0-9a-f-]{36}/$"))
    secret = page.locator("#new-secret")
    expect(secret).to_have_text(re.compile(r"^whsec_[A-Za-z0-9+/]{43}=$"))
    expect(page.locator(".secret-once")).to_contain_text("Copy it now")
    shown = secret.inner_text()
    assert "whsec_" not in page.url
    page.get_by_role("button", name="Copy").click()
    expect(page.locator("#copy-status")).not_to_be_empty()
    screenshot(page, "subscription-secret-once")

    subscription = Subscription.objects.get()
    assert unseal_value(subscription.secret) == shown
    assert subscription.event_types == ["ServiceCallSucceeded", "ServiceCallFailed"]

    page.reload()
    expect(page.get_by_role("heading", name="Billing system")).to_be_visible()
    expect(page.locator("#new-secret")).to_have_count(0)
    assert shown not in page.content()

    page.get_by_role("link", name="← All subscriptions").click()
    expect(page.locator("#subscriptions-table")).to_contain_text("Billing system")
    assert shown not in page.content()
    screenshot(page, "subscriptions-list")
    assert page.evaluate("window.__csp") == []


def test_a_test_event_is_followed_until_it_succeeds_without_a_reload(page, world, engine, http_target):
    from tests.support.subscriptions import make_subscription

    subscription, _ = make_subscription("acme", name="Receiver", url=http_target.url("/ok"))
    log_in(page, "owner", "pw-owner-123")
    page.goto(f"/subscriptions/{subscription.pk}/")
    page.get_by_role("button", name="Send test event").click()
    page.wait_for_url(re.compile(rf".*/subscriptions/{subscription.pk}/.*"))
    page.evaluate("window.__notReloaded = true")
    delivery = page.locator("tbody.delivery").first
    expect(delivery).to_have_attribute("data-state", "SUCCEEDED", timeout=15_000)
    assert page.evaluate("window.__notReloaded === true")  # the same page, followed in place
    assert http_target.count("/ok") >= 1
