"""In a real browser: define a call on the request page, submit it, see its response."""

import json
import re

import pytest
from playwright.sync_api import expect

from orchestration.models import ServiceCall
from tests.browser.conftest import log_in, screenshot

pytestmark = pytest.mark.browser


def test_a_call_submitted_from_the_request_page_shows_its_response(page, world, engine, http_target):
    log_in(page, "owner", "pw-owner-123")
    page.get_by_role("link", name="New request").first.click()

    page.get_by_label("Name", exact=True).fill("Echo from the browser")
    page.get_by_label("Method", exact=True).select_option("POST")
    page.get_by_label("URL", exact=True).fill(http_target.url("/echo"))
    page.get_by_label("Header name").first.fill("X-Trace")
    page.get_by_label("Header value").first.fill("trace-1")
    page.get_by_role("button", name="+ Add row").click()
    page.get_by_label("Header name").nth(1).fill("Authorization")
    expect(page.get_by_label("Header value").nth(1)).to_have_attribute("type", "password")
    page.get_by_label("Header value").nth(1).fill("Bearer browser-secret")

    body = page.locator("#id_body")
    body.fill('{"order": 1042, "items": [1, 2')
    expect(page.locator("#body-status")).to_contain_text("Invalid JSON")
    expect(body).to_have_attribute("aria-invalid", "true")
    body.fill('{"order": 1042, "items": [1, 2]}')
    expect(page.locator("#body-status")).to_have_text("✓ Valid JSON")
    page.get_by_label("Tags", exact=True).fill("browser demo")
    page.get_by_role("button", name="Submit").click()

    result = page.locator("#result")
    expect(result.locator(".badge")).to_have_text("Succeeded", timeout=8000)
    pretty = page.locator("#response-body")
    expect(pretty).to_contain_text('"method": "POST"')
    echoed = json.loads(pretty.inner_text())
    assert echoed["body"] == '{"order":1042,"items":[1,2]}'
    expect(page.locator("#response table.kv-table")).to_contain_text("Content-Type")
    screenshot(page, "request-page-response")

    call = ServiceCall.objects.get(tenant_id="acme")
    assert call.status == ServiceCall.Status.SUCCEEDED
    [sent] = [r for r in http_target.requests if r["path"] == "/echo"]
    assert sent["headers"]["Authorization"] == "Bearer browser-secret"
    assert sent["headers"]["X-Trace"] == "trace-1"
    # The secret went to the target, never back into the page.
    assert "browser-secret" not in page.content()


def test_invalid_input_is_shown_on_its_field_and_nothing_is_stored(page, world):
    log_in(page, "owner", "pw-owner-123")
    page.goto("/calls/new/")
    page.get_by_label("Name", exact=True).fill("Bad URL")
    page.get_by_label("URL", exact=True).fill("ftp://files.example.com/x")
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#url-errors")).to_contain_text("http or https")
    expect(page.get_by_label("Name", exact=True)).to_have_value("Bad URL")
    assert re.search(r"/calls/new/$", page.url)
    assert not ServiceCall.objects.exists()
