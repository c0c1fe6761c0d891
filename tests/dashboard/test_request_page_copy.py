"""'Copy into a new request': the request page prefilled from a call of the current tenant,
never holding a secret header value (docs/security.md §4)."""

from __future__ import annotations

import html as html_lib
import re

from orchestration.services import service_call_favorite_set
from tests.support.factories import HOUR, make_call, make_member


def _copy(client, call):
    return client.get(f"/calls/new/?from={call.pk}")


def _header_rows(page: str) -> list[tuple[str, str, str]]:
    """(name, value input type, value) of each header row of the request page."""
    rows = re.findall(
        r'<input type="text" name="header_name" value="([^"]*)".*?<input type="(\w+)" name="header_value" value="([^"]*)"',
        page,
        re.S,
    )
    return [(name, kind, value) for name, kind, value in rows]


def test_it_opens_the_request_page_prefilled_with_the_calls_request(owner_client, world):
    call = make_call(
        "acme",
        name="Invoice export",
        method="POST",
        url="https://billing.example.com/export?day=1",
        headers={"Authorization": "Bearer copy-secret-1", "X-Trace": "t-9", "Content-Type": "application/json"},
        body={"order": 7, "lines": [1, 2]},
        tags=["billing", "nightly"],
        timeout_ms=4000,
        due_in=HOUR,
    )
    service_call_favorite_set(tenant_id="acme", service_call_id=call.pk, favorite=True)

    response = _copy(owner_client, call)

    assert response.status_code == 200
    page = response.content.decode()
    form = response.context["form"]
    assert not form.is_bound
    assert form["name"].value() == "Invoice export"
    assert form["method"].value() == "POST"
    assert form["url"].value() == "https://billing.example.com/export?day=1"
    assert form["body_format"].value() == "json"
    assert form["body"].value() == '{\n  "order": 7,\n  "lines": [\n    1,\n    2\n  ]\n}'
    assert form["tags"].value() == "billing nightly"  # the star is not a tag to copy
    assert form["timeout_ms"].value() == 4000
    assert form["when"].value() == "now"
    assert _header_rows(page) == [
        ("Authorization", "password", ""),
        ("X-Trace", "text", "t-9"),
        ("Content-Type", "text", "application/json"),
    ]
    # The secret is nowhere in the page, not even redacted; a visible note asks for it again.
    assert "copy-secret-1" not in page and "***" not in page
    note = re.search(r'<div class="message message-info copy-note"[^>]*>(.*?)</div>', page, re.S).group(1)
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", note))
    assert "Copied from Invoice export" in text
    assert "Secret header values are not copied: enter Authorization again." in re.sub(r"\s+", " ", text)
    assert f'href="/calls/{call.pk}/"' in note


def test_a_text_body_stays_text_and_a_default_timeout_stays_empty(owner_client, world):
    call = make_call("acme", name="plain", method="PUT", body='{"not": "parsed"}', due_in=HOUR)

    form = _copy(owner_client, call).context["form"]

    assert form["body_format"].value() == "text"
    assert form["body"].value() == '{"not": "parsed"}'
    assert form["timeout_ms"].value() is None


def test_a_value_stored_sealed_stays_out_even_if_its_name_is_no_longer_secret(owner_client, world, settings):
    call = make_call("acme", name="keyed", headers={"X-Api-Key": "sealed-value-2"}, due_in=HOUR)
    settings.SECRET_HEADER_PATTERNS = ["password"]

    page = _copy(owner_client, call).content.decode()

    assert _header_rows(page) == [("X-Api-Key", "password", "")]
    assert "sealed-value-2" not in page and "***" not in page
    assert 'enter <span class="mono">X-Api-Key</span> again' in page


def test_a_call_of_another_tenant_is_404(owner_client, world):
    theirs = make_call("globex", name="globex call", headers={"Authorization": "Bearer globex-secret"}, due_in=HOUR)
    response = _copy(owner_client, theirs)
    assert response.status_code == 404
    assert "globex call" not in response.content.decode()


def test_a_call_of_the_users_other_tenant_is_404_too_the_copy_would_go_to_the_current_one(owner_client, world):
    make_member("owner", "globex")
    theirs = make_call("globex", name="globex call", due_in=HOUR)
    assert _copy(owner_client, theirs).status_code == 404
    # Its details page shows it (offering the switch) but offers no copy.
    page = owner_client.get(f"/calls/{theirs.pk}/").content.decode()
    assert "globex call" in page and "Copy into a new request" not in page


def test_an_id_that_is_not_a_call_is_404(owner_client, world):
    assert owner_client.get("/calls/new/?from=not-a-uuid").status_code == 404
    assert owner_client.get("/calls/new/?from=0190a000-0000-7000-8000-000000000000").status_code == 404


def test_the_details_page_links_to_the_copy(owner_client, world):
    call = make_call("acme", name="mine", due_in=HOUR)
    page = owner_client.get(f"/calls/{call.pk}/").content.decode()
    assert f'href="/calls/new/?from={call.pk}">Copy into a new request</a>' in page
