"""In a real browser, DEBUG off: the 404 and 403 pages are the site's, with its navigation and a
way back."""

import re
import uuid

import pytest
from django.conf import settings
from playwright.sync_api import expect

from tests.browser.conftest import expect_http_error, log_in, screenshot
from tests.support.factories import HOUR, make_call

pytestmark = pytest.mark.browser


def test_a_missing_call_is_the_sites_404_and_the_navigation_leads_back(page, world):
    assert settings.DEBUG is False
    expect_http_error(page, 404)
    make_call("acme", name="Still here", due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")

    response = page.goto(f"/calls/{uuid.uuid4()}/")

    assert response.status == 404
    expect(page).to_have_title("Page not found · Service Agent")
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="New request")).to_be_visible()
    expect(page.locator(".tenant-name")).to_contain_text("Acme")
    screenshot(page, "error-404")
    page.get_by_role("link", name="← Calls").click()
    page.wait_for_url(re.compile(r"/calls/$"))
    expect(page.locator("table.calls")).to_contain_text("Still here")


def test_a_staff_page_is_the_sites_403_for_a_member(page, world):
    expect_http_error(page, 403)
    log_in(page, "owner", "pw-owner-123")

    response = page.goto("/system/")

    assert response.status == 403
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    screenshot(page, "error-403")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="New request").click()
    page.wait_for_url(re.compile(r"/calls/new/$"))


def test_an_anonymous_visitor_is_offered_the_login(page, world):
    expect_http_error(page, 404)
    response = page.goto("/no-such-page/")
    assert response.status == 404
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    page.get_by_role("link", name="Log in").click()
    page.wait_for_url(re.compile(r"/login/"))
