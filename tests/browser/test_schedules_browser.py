"""In a real browser: the new-schedule page previews the next runs in the chosen time zone as
the user types (static/js/schedules.js asking the API's preview with the session), says why a
cron is refused, creates the schedule, and its page pauses and resumes it; no script breaks
the Content-Security-Policy (the `page` fixture fails the test on any console error)."""

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import expect

from orchestration.models import ServiceCall
from schedules.models import Schedule
from tests.browser.conftest import log_in, screenshot
from tests.support.schedules import make_schedule

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
    # The zone named as every page names it (the browser's en-GB would say GMT+5:30).
    zone.fill("Asia/Kolkata")
    expect(page.locator("#preview-status")).to_have_text("Next runs in Asia/Kolkata:")
    expect(runs.first).to_contain_text(" IST")
    zone.fill("America/New_York")
    expect(page.locator("#preview-status")).to_have_text("Next runs in America/New_York:")
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


def test_a_schedule_page_shows_its_policies_pauses_with_a_note_and_runs_a_past_range(page, world):
    schedule = make_schedule(name="Berlin nightly", cron="30 2 * * *", timezone="Europe/Berlin")
    Schedule.objects.filter(pk=schedule.pk).update(
        dst_skipped="skip", jitter_ms=600_000, catchup_window_s=7200, overlap="bufferOne"
    )
    log_in(page, "owner", "pw-owner-123")
    page.goto(f"/schedules/{schedule.pk}/")
    facts = page.locator(".facts")
    expect(facts).to_contain_text("a skipped local time is skipped")
    expect(facts).to_contain_text("up to 600 s")
    expect(facts).to_contain_text("2h")
    expect(page.locator("#overlap")).to_contain_text("bufferOne")
    expect(page.locator("#dst-preview")).to_contain_text("afterJump")
    screenshot(page, "schedule-policies")

    page.locator("#backfill summary").click()
    yesterday = (datetime.now(UTC) - timedelta(days=1)).astimezone(ZoneInfo("Europe/Berlin"))
    page.locator("#backfill-from").fill(yesterday.strftime("%Y-%m-%dT00:00"))
    page.locator("#backfill-to").fill(yesterday.strftime("%Y-%m-%dT23:59"))
    page.locator("#backfill-overlap").select_option("allowAll")
    page.get_by_role("button", name="Run them").click()
    expect(page.locator(".messages")).to_contain_text("1 occurrence(s) of the range run now")
    backfilled = ServiceCall.objects.get(schedule_id=schedule.pk, occurrence_at__lt=datetime.now(UTC))
    assert backfilled.overlap == "allowAll"

    page.get_by_label("Why (optional)").fill("vendor maintenance")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#paused-note-shown")).to_have_text("Why: vendor maintenance")
