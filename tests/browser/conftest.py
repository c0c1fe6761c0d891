"""Real-browser tests: Debian's Chromium driven by Playwright against pytest-django's live
server, with the engine running in this process so calls really execute.

Playwright's browser download cannot work here, so the system Chromium is launched; the
tests skip with a clear reason where it is missing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; the ORM calls of the tests
# themselves are still synchronous.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
BROWSER_ZONE = "Europe/Berlin"


@pytest.fixture(scope="session")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser, live_server):
    """A fresh browser context in a known time zone; JavaScript errors fail the test."""
    context = browser.new_context(
        base_url=live_server.url,
        viewport={"width": 1366, "height": 900},
        timezone_id=BROWSER_ZONE,
        locale="en-GB",
    )
    context.set_default_timeout(5000)
    page = context.new_page()
    errors: list[str] = []
    expected_statuses = {400}
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if _is_error(message, expected_statuses) else None)
    EXPECTED_STATUSES[id(page)] = expected_statuses
    yield page
    del EXPECTED_STATUSES[id(page)]
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


# Per page: the HTTP error statuses its test opens on purpose (Chromium logs each as an error).
EXPECTED_STATUSES: dict[int, set[int]] = {}


def expect_http_error(page, status: int) -> None:
    """The test opens a page answering `status` on purpose (an error page under test)."""
    EXPECTED_STATUSES[id(page)].add(status)


def _is_error(message, expected_statuses: set[int]) -> bool:
    # A form sent back with its errors answers 400 on purpose; Chromium logs that as an error.
    # Pages without an icon link (the admin's) make Chromium probe /favicon.ico, which is none.
    if message.type != "error" or any(f"status of {status}" in message.text for status in expected_statuses):
        return False
    return not (message.location or {}).get("url", "").endswith("/favicon.ico")


def log_in(page, username: str, password: str) -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r".*/calls/$"))


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
