"""In a real browser: the Signing page turns the tenant's signed calls on and shows the secret
once, with a Copy button; a rotation shows a new one and says until when the previous one signs;
a reload shows neither."""

import re

import pytest
from playwright.sync_api import expect

from execution.models import CallSigning
from tests.browser.conftest import log_in, screenshot

pytestmark = pytest.mark.browser


def test_signing_is_turned_on_with_the_secret_shown_once_then_rotated(page, world):
    log_in(page, "owner", "pw-owner-123")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Signing").click()
    expect(page.locator("#signing-state")).to_contain_text("Off")
    page.get_by_role("button", name="Sign my calls").click()
    expect(page.locator("#signing-state")).to_contain_text("On")
    secret = page.locator("#new-secret").inner_text()
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{43}=", secret)
    page.get_by_role("button", name="Copy").click()
    expect(page.locator("#copy-status")).to_have_text(re.compile(r"Copied|Selected"))
    screenshot(page, "signing-on")
    assert CallSigning.objects.get(tenant_id="acme").enabled

    page.reload()
    expect(page.locator("#new-secret")).to_have_count(0)
    page.get_by_role("button", name="Rotate secret").click()
    expect(page.locator("#new-secret")).not_to_have_text(secret)
    expect(page.locator(".facts")).to_contain_text("signs too until")

    page.get_by_role("button", name="Stop signing").click()
    expect(page.locator("#signing-state")).to_contain_text("Off")
    assert not CallSigning.objects.get(tenant_id="acme").enabled
