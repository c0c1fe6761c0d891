"""In a real browser: the tenant changes only by the switcher's POST; a shared link naming
another of the user's tenants offers the switch and comes back to the link."""

import re

import pytest
from playwright.sync_api import expect

from eventservice.dashboard.tenancy import SESSION_KEY
from tests.browser.conftest import log_in
from tests.support.factories import HOUR, make_call, make_member

pytestmark = pytest.mark.browser


def _current_tenant(page) -> str:
    return page.locator("#tenant-select").input_value()


def test_a_shared_link_offers_the_switch_and_the_header_switches_back(page, world):
    make_member("owner", "globex")
    make_call("acme", name="Acme nightly", due_in=HOUR)
    make_call("globex", name="Globex nightly", due_in=HOUR)
    make_call("globex", name="Globex weekly", due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    assert _current_tenant(page) == "acme"

    page.goto("/calls/?tenant=globex&q=nightly")
    expect(page.get_by_role("heading", name="This link is for Globex")).to_be_visible()
    expect(page.get_by_text("Globex nightly")).to_have_count(0)
    assert _current_tenant(page) == "acme"  # opening the link changed nothing

    page.get_by_role("button", name="Switch to Globex").click()
    page.wait_for_url(re.compile(r"/calls/\?tenant=globex&q=nightly$"))
    expect(page.get_by_text("Globex nightly")).to_be_visible()
    expect(page.get_by_text("Globex weekly")).to_have_count(0)  # the link's filter kept
    assert _current_tenant(page) == "globex"

    page.get_by_label("Tenant").select_option("acme")  # the header's switcher posts at once
    page.wait_for_url(re.compile(r"/calls/$"))
    expect(page.get_by_text("Acme nightly")).to_be_visible()
    assert _current_tenant(page) == "acme"


def test_a_link_to_a_call_of_another_own_tenant_shows_it_with_the_offer(page, world, live_server):
    from django.contrib.sessions.models import Session

    make_member("owner", "globex")
    call = make_call("globex", name="Globex report", due_in=HOUR)
    log_in(page, "owner", "pw-owner-123")
    page.goto(f"/calls/{call.pk}/")
    expect(page.get_by_role("heading", name="Globex report")).to_be_visible()
    offer = page.locator(".tenant-offer")
    expect(offer).to_contain_text("This call belongs to Globex")
    assert _current_tenant(page) == "acme"
    assert Session.objects.get().get_decoded()[SESSION_KEY] == "acme"

    offer.get_by_role("button", name="Switch to Globex").click()
    page.wait_for_url(re.compile(rf"/calls/{call.pk}/$"))
    expect(page.locator(".tenant-offer")).to_have_count(0)
    assert _current_tenant(page) == "globex"
