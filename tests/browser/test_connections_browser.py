"""In a real browser: the Connections page makes an OAuth2 connection (a missing secret is said
beside its field, nothing stored), lists it, shows it without its secret, rotates the secret, and
refuses to delete it while a call names it, then deletes it."""

import pytest
from playwright.sync_api import expect

from core.secrets import unseal_value
from execution.models import Connection
from orchestration.services import service_call_cancel
from tests.browser.conftest import log_in, screenshot
from tests.support.factories import make_call

pytestmark = pytest.mark.browser

KIND = "oauth2ClientCredentials"


def test_a_connection_is_made_shown_without_its_secret_rotated_and_deleted_once_unused(page, world):
    log_in(page, "owner", "pw-owner-123")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Connections").click()
    expect(page.locator("#connections-table")).to_contain_text("No connections yet")

    form = page.locator("#connection-form")
    form.get_by_label("Name", exact=True).fill("billing")
    form.locator(f"input[name=kind][value={KIND}]").check()
    kind = form.locator(f"fieldset[data-kind={KIND}]")
    kind.get_by_label("Token URL").fill("https://auth.example.com/oauth/token")
    kind.get_by_label("Client id").fill("service-agent")
    kind.get_by_label("Scope").fill("invoices:write")
    form.get_by_role("button", name="Make connection").click()
    # No client secret: said beside the field, what was typed kept, nothing stored.
    expect(page.locator(f"#c-{KIND}-clientSecret-errors")).to_contain_text("Required")
    expect(kind.get_by_label("Client id")).to_have_value("service-agent")
    assert not Connection.objects.exists()

    kind.get_by_label("Client secret").fill("first-s3cret")
    form.get_by_role("button", name="Make connection").click()
    expect(page.locator("h1")).to_contain_text("billing")
    expect(page.locator("#connection-facts")).to_contain_text("https://auth.example.com/oauth/token")
    assert "first-s3cret" not in page.content()
    screenshot(page, "connection-detail")

    # The change form shows what the connection has (never the secret): a scope cleared, a secret
    # rotated.
    change = page.locator("#connection-change")
    expect(change.get_by_label("Client id")).to_have_value("service-agent")
    expect(change.get_by_label("Client secret")).to_have_value("")
    change.get_by_label("Scope").fill("")
    change.get_by_label("Client secret").fill("second-s3cret")
    change.get_by_role("button", name="Save").click()
    expect(page.locator(".messages")).to_contain_text("new secret is used from the next attempt")
    stored = Connection.objects.get(name="billing")
    assert unseal_value(stored.secret) == "second-s3cret" and "scope" not in stored.config
    assert stored.config["clientId"] == "service-agent"
    assert "second-s3cret" not in page.content()

    call = make_call(url="http://127.0.0.1:9/", connection="billing", due_in=3600)
    page.get_by_role("button", name="Delete connection").click()
    expect(page.locator(".messages")).to_contain_text(f"call {call.pk}")
    assert Connection.objects.filter(name="billing").exists()
    service_call_cancel(tenant_id="acme", service_call_id=call.pk)
    page.get_by_role("button", name="Delete connection").click()
    expect(page.locator(".messages")).to_contain_text("deleted")
    expect(page.locator("#connections-table")).to_contain_text("No connections yet")
    screenshot(page, "connections")
