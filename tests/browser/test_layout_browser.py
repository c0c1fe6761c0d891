"""Every screen tidy at 1400 and 820 px wide (a laptop, a tablet): no page's main table or form
overflows its container or the window, so no column (Outcome, the actions, "Due at") is cut
off, with realistic data (long names, many tags, a failed call with a long error)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import expect_http_error, log_in, screenshot
from tests.support.factories import make_call, make_failed_call, make_succeeded_call, make_user
from tests.support.schedules import make_schedule
from tests.support.subscriptions import make_subscription

pytestmark = pytest.mark.browser

LONG = "Quarterly reconciliation export for the finance team (EMEA, all subsidiaries)"

# What overflows: the window itself, or any element of the page's main part that scrolls or
# clips sideways because its content is wider than it (a table cut off at its container).
OVERFLOWING = """() => {
  const found = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) found.push(`the window: ${root.scrollWidth} > ${root.clientWidth}`);
  for (const el of document.querySelectorAll("main *, #content *")) {
    const style = getComputedStyle(el);
    if (!["auto", "scroll", "hidden"].includes(style.overflowX)) continue;
    if (el.clientWidth > 1 && el.scrollWidth > el.clientWidth + 1) {  // (a visually hidden label is 1 px)
      found.push(`${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}.${el.className}: ${el.scrollWidth} > ${el.clientWidth}`);
    }
  }
  return found;
}"""


@pytest.fixture
def realistic(world):
    make_user("root", password="pw-root-123", superuser=True)
    tags = ["billing", "nightly", "reports", "emea", "finance", "q4"]
    failed = make_failed_call(name=LONG, tags=tags)
    make_succeeded_call(name="Fetch the order document", tags=["billing"])
    make_call(name=LONG + " (scheduled)", tags=tags, due_in=3600)
    schedule = make_schedule(name=LONG, cron="30 2 * * *", timezone="Asia/Kolkata")
    subscription, _ = make_subscription("acme", name=LONG, url="https://hooks.example.com/" + "a" * 120)
    return {"failed": failed, "schedule": schedule, "subscription": subscription}


PAGES = [
    "/calls/",
    "/calls/new/",
    "/calls/batch/",
    "/calls/{failed}/",
    "/schedules/",
    "/schedules/new/",
    "/schedules/{schedule}/",
    "/subscriptions/",
    "/subscriptions/new/",
    "/subscriptions/{subscription}/",
    "/flow-control/",
    "/connections/",
    "/signing/",
]
# An operator's: the system page, and the admin's lists (at a laptop's width; at a tablet's the
# admin's own layout scrolls a wide list sideways, as Django's admin does).
STAFF_PAGES = [
    "/system/",
    "/admin/orchestration/servicecall/",
    "/admin/tenants/apikey/",
    "/admin/schedules/schedule/",
    "/admin/delivery/subscription/",
]


@pytest.mark.parametrize("width", [1400, 820])
def test_no_screen_overflows_at_a_laptops_or_a_tablets_width(page, realistic, width):
    page.set_viewport_size({"width": width, "height": 900})
    ids = {key: value.pk for key, value in realistic.items()}
    problems = {}
    log_in(page, "owner", "pw-owner-123")
    for path in PAGES:
        page.goto(path.format(**ids))
        if found := page.evaluate(OVERFLOWING):
            problems[path] = found
            screenshot(page, f"overflow-{width}-{path.strip('/').replace('/', '-')[:40]}")
    expect_http_error(page, 403)  # the last page's live updates, once logged out
    page.context.clear_cookies()
    page.goto("/admin/login/")
    page.get_by_label("Username").fill("root")
    page.get_by_label("Password").fill("pw-root-123")
    page.get_by_role("button", name="Log in").click()
    for path in STAFF_PAGES:
        if path.startswith("/admin/") and width < 1024:
            continue
        page.goto(path)
        if found := page.evaluate(OVERFLOWING):
            problems[path] = found
            screenshot(page, f"overflow-{width}-{path.strip('/').replace('/', '-')[:40]}")
    assert not problems, "\n".join(f"{path}: {found}" for path, found in problems.items())


def test_the_calls_filters_keep_the_url_clean_and_a_tag_link_adds_its_tag_once(page, world):
    from urllib.parse import parse_qs, urlsplit

    def query() -> dict[str, list[str]]:
        return parse_qs(urlsplit(page.url).query, keep_blank_values=True)

    make_call(name="tagged", tags=["billing", "emea"])
    log_in(page, "owner", "pw-owner-123")
    page.goto("/calls/")
    page.get_by_role("button", name="Apply filters").click()
    page.wait_for_load_state()
    assert all(all(values) for values in query().values()), page.url  # no empty "tag=" or "q="
    page.locator("a.chip", has_text="billing").first.click()
    page.wait_for_url("**tag=billing**")
    assert query()["tag"] == ["billing"], page.url
    page.locator("a.chip", has_text="billing").first.click()  # again: no second copy
    page.wait_for_load_state()
    assert query()["tag"] == ["billing"], page.url
    for label in ("Submitted from", "Submitted to", "Due from", "Due to"):
        assert "(UTC day)" in page.locator(f"label:has-text('{label}')").first.inner_text()
