"""In a real browser: the Content-Security-Policy holds on every kind of page, and nothing on
them breaks it (dashboard, tenant prompt, admin, API docs). docs/security.md#6-deployment-hardening"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import log_in
from tests.support.factories import HOUR, make_call, make_member, make_user

pytestmark = pytest.mark.browser

# Recorded in the page itself: Playwright's init scripts are not subject to the page's policy.
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline"));
});
"""


def _directives(policy: str) -> dict[str, list[str]]:
    parts = [part.split() for part in policy.split(";") if part.strip()]
    return {part[0]: part[1:] for part in parts}


def _visit(page, path: str, violations: list[str]) -> None:
    response = page.goto(path)
    assert response.status < 400, f"{path} answered {response.status}"
    policy = _directives(response.headers.get("content-security-policy", ""))
    assert policy["script-src"][0] == "'self'" and "'unsafe-inline'" not in policy["script-src"], path
    assert policy["style-src"] == ["'self'"] and policy["object-src"] == ["'none'"], path
    # The one relaxation: style attributes in the admin (eventservice/middleware.py).
    assert ("style-src-attr" in policy) == path.startswith("/admin/"), path
    page.wait_for_load_state("load")
    violations += [f"{path}: {v}" for v in page.evaluate("window.__csp")]


@pytest.fixture
def watched(page):
    """The conftest page (console errors fail the test; a CSP refusal is one) plus the listener."""
    page.context.add_init_script(WATCH)
    return page


def test_dashboard_pages_raise_no_csp_violation(watched, world):
    page = watched
    make_member("owner", "globex")
    call = make_call("acme", name="CSP check", due_in=HOUR)
    make_call("globex", name="Other tenant's call", due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    violations: list[str] = []
    for path in [
        "/calls/",
        "/calls/?status=Scheduled&q=CSP",
        "/calls/new/",
        f"/calls/{call.pk}/",
        "/calls/?tenant=globex",
        "/flow-control/",
    ]:
        _visit(page, path, violations)
    # The page's own scripts ran: times localized, the header's switcher wired.
    _visit(page, f"/calls/{call.pk}/", violations)
    expect(page.locator("time[data-localized]").first).to_be_attached()
    page.get_by_label("Tenant").select_option("globex")
    page.wait_for_url(re.compile(r"/calls/$"))
    expect(page.get_by_text("Other tenant's call")).to_be_visible()
    violations += page.evaluate("window.__csp")
    assert violations == []


def test_the_login_and_admin_pages_raise_no_csp_violation(watched, world):
    page = watched
    make_user("root", superuser=True)
    call = make_call("acme", name="Admin CSP check", due_in=HOUR)
    violations: list[str] = []
    _visit(page, "/login/", violations)
    _visit(page, "/admin/login/", violations)
    page.get_by_label("Username").fill("root")
    page.get_by_label("Password").fill("pw-root-123")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"/admin/$"))
    for path in [
        "/admin/",
        "/admin/tenants/tenant/",
        "/admin/tenants/tenant/add/",
        "/admin/tenants/apikey/add/",
        "/admin/orchestration/servicecall/",
        f"/admin/orchestration/servicecall/{call.pk}/change/",
        "/admin/orchestration/flowcontrol/add/",
        "/admin/auth/user/",
        f"/admin/auth/user/{world.owner.pk}/change/",
        "/system/",
    ]:
        _visit(page, path, violations)
    assert violations == []


def test_the_api_docs_render_under_the_policy(watched, world):
    page = watched
    log_in(page, "owner", "pw-owner-123")
    violations: list[str] = []
    _visit(page, "/api/docs/", violations)
    # Swagger UI is built by the nonce-carrying bootstrap script: operations listed means it ran.
    expect(page.locator(".opblock").first).to_be_visible(timeout=10000)
    violations += page.evaluate("window.__csp")
    assert violations == []


def test_the_policy_refuses_an_injected_inline_script_and_the_listener_sees_it(browser, live_server, world):
    # The watch above must be able to fail: an inline script injected into a page is refused.
    context = browser.new_context(base_url=live_server.url)
    try:
        context.add_init_script(WATCH)
        page = context.new_page()
        page.goto("/login/")
        page.evaluate(
            "() => { const s = document.createElement('script'); s.textContent = 'window.__ran = 1';"
            " document.body.appendChild(s); }"
        )
        page.wait_for_function("window.__csp.length > 0")
        assert page.evaluate("window.__ran") is None
        assert page.evaluate("window.__csp")[0].startswith("script-src")
    finally:
        context.close()
