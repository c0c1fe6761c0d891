"""In a real browser: the new-schedule page previews the next runs in the chosen time zone as
the user types (static/js/schedules.js asking the API's preview with the session), says why a
cron is refused, creates the schedule, and its page pauses and resumes it; no script breaks
the Content-Security-Policy (the `page` fixture fails the test on any console error)."""

import re

import pytest
from playwright.sync_api import expect

from orchestration.models import ServiceCall
from schedules.models import Schedule
from tests.browser.conftest import log_in, screenshot

pytestmark = pytest.mark.browser

WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline"));
});
"""


def test_the_create_page_previews_the_next_runs_live_and_the_schedule_pauses_and_resumes(page, world):
    page.context.add_init_script(WATCH)
    log_in(page, "owner", "pw-owner-123")
    page.get_by_role("link", name="Schedules").click()
    expect(page.get_by_role("heading", name="Schedules")).to_be_visible()
    page.get_by_role("link", name="New schedule").click()

    zone = page.get_by_label("Time zone")
    expect(zone).to_have_value("Europe/Berlin")  # the browser's zone, filled in
    runs = page.locator("#schedule-preview li")
    page.get_by_label("Cron").fill("30 2 * * *")
    expect(runs).to_have_count(5)
    for local in runs.evaluate_all("items => items.map(item => item.dataset.local)"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT0(2:30|3:00):00\+0[12]:00", local), local
    expect(page.locator("#preview-status")).to_have_text("Next runs in Europe/Berlin:")

    page.get_by_label("Cron").fill("*/10 * * * * *")
    expect(page.locator("#preview-status")).to_contain_text("intervals under a minute")
    expect(runs).to_have_count(0)

    page.get_by_label("Cron").fill("0 9 * * 1-5")
    zone.fill("America/New_York")
    expect(page.locator("#preview-status")).to_have_text("Next runs in America/New_York:")
    expect(runs).to_have_count(5)
    for local in runs.evaluate_all("items => items.map(item => item.dataset.local)"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT09:00:00-0[45]:00", local), local
    screenshot(page, "schedule-new-preview")

    page.get_by_label("Name", exact=True).fill("Weekday report")
    page.get_by_label("URL", exact=True).fill("http://127.0.0.1:9/report")
    page.get_by_role("button", name="Create schedule").click()
    page.wait_for_url(re.compile(r".*/schedules/[0-9a-f-]{36}/$"))
    expect(page.get_by_role("heading", name="Weekday report")).to_be_visible()
    expect(page.locator("#schedule-state")).to_have_text("active")
    expect(page.locator("#next-runs li")).to_have_count(5)
    expect(page.locator("#schedule-calls tbody tr")).to_have_count(1)
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.timezone) == ("0 9 * * 1-5", "America/New_York")

    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#schedule-state")).to_have_text("paused")
    expect(page.locator("#next-runs-none")).to_contain_text("Paused")
    assert ServiceCall.objects.get().status == ServiceCall.Status.CANCELLED

    page.get_by_role("button", name="Resume").click()
    expect(page.locator("#schedule-state")).to_have_text("active")
    expect(page.locator("#next-runs li")).to_have_count(5)
    screenshot(page, "schedule-detail")

    page.get_by_role("link", name="← All schedules").click()
    expect(page.locator("#schedules-table")).to_contain_text("Weekday report")
    expect(page.locator("#schedules-table")).to_contain_text("America/New_York")
    assert page.evaluate("window.__csp") == []
