"""The status page: rows, filters in the URL, favorites, pagination, tenant isolation."""

import re

from orchestration.services import service_call_favorite_set
from tests.support.factories import HOUR, make_call, make_failed_call, make_succeeded_call


def _names(response) -> list[str]:
    return [row["call"].name for row in response.context["rows"]]


def test_it_lists_the_tenants_calls_newest_first_with_id_status_and_details(owner_client, world):
    older = make_call("acme", name="older", due_in=HOUR)
    newer = make_succeeded_call("acme", name="newer")
    response = owner_client.get("/calls/")
    assert response.status_code == 200
    assert _names(response) == ["newer", "older"]
    html = response.content.decode()
    assert f">{str(newer.pk)[-8:]}</a>" in html
    assert f'href="/calls/{older.pk}/"' in html
    assert '<span class="badge badge-succeeded">Succeeded</span>' in html
    assert '<span class="badge badge-scheduled">Scheduled</span>' in html
    assert re.search(r'<time datetime="\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z" title="[^"]+ UTC">', html)


def test_an_outsider_sees_none_of_another_tenants_calls(outsider_client, world):
    make_call("acme", name="acme secret roadmap", due_in=HOUR)
    make_call("globex", name="globex own call", due_in=HOUR)
    response = outsider_client.get("/calls/")
    assert _names(response) == ["globex own call"]
    assert "acme secret roadmap" not in response.content.decode()


def test_it_filters_by_status(owner_client, world):
    make_call("acme", name="waiting", due_in=HOUR)
    make_succeeded_call("acme", name="done")
    make_failed_call("acme", name="broken")
    assert _names(owner_client.get("/calls/?status=Failed")) == ["broken"]
    assert _names(owner_client.get("/calls/?status=Failed&status=Succeeded")) == ["broken", "done"]


def test_two_tag_filters_keep_calls_that_carry_both(owner_client, world):
    make_call("acme", name="billing only", tags=["billing"], due_in=HOUR)
    make_call("acme", name="both", tags=["billing", "nightly"], due_in=HOUR)
    make_call("acme", name="nightly only", tags=["nightly"], due_in=HOUR)
    response = owner_client.get("/calls/?tag=billing&tag=nightly")
    assert _names(response) == ["both"]
    html = response.content.decode()
    # Each active tag is a chip whose × removes just that tag from the URL.
    assert 'href="?tag=nightly"' in html and 'href="?tag=billing"' in html


def test_it_filters_by_text_in_the_name(owner_client, world):
    make_call("acme", name="Nightly Export", due_in=HOUR)
    make_call("acme", name="invoice sync", due_in=HOUR)
    assert _names(owner_client.get("/calls/?q=export")) == ["Nightly Export"]


def test_show_favorites_lists_only_starred_calls(owner_client, world):
    starred = make_call("acme", name="starred", due_in=HOUR)
    make_call("acme", name="plain", due_in=HOUR)
    service_call_favorite_set(tenant_id="acme", service_call_id=starred.pk, favorite=True)
    response = owner_client.get("/calls/?favorite=true")
    assert _names(response) == ["starred"]
    assert 'aria-pressed="true"' in response.content.decode()


def test_it_filters_by_submission_date(owner_client, world):
    call = make_call("acme", name="today", due_in=HOUR)
    day = call.submitted_at.date()
    assert _names(owner_client.get(f"/calls/?submittedFrom={day}&submittedTo={day}")) == ["today"]
    assert _names(owner_client.get(f"/calls/?submittedFrom={day.replace(year=day.year + 1)}")) == []


def test_it_reports_an_invalid_filter_instead_of_ignoring_it(owner_client, world):
    make_call("acme", name="anything", due_in=HOUR)
    response = owner_client.get("/calls/?submittedFrom=yesterday-ish")
    assert response.status_code == 400
    assert _names(response) == []
    assert "submittedFrom" in response.content.decode()


def test_it_paginates_with_a_records_per_page_choice_and_keeps_filters_in_the_links(owner_client, world):
    for number in range(12):
        make_call("acme", name=f"call {number:02d}", tags=["bulk"], due_in=HOUR)
    first = owner_client.get("/calls/?tag=bulk&per=10")
    html = first.content.decode()
    assert "1–10 of 12" in html
    assert _names(first) == [f"call {n:02d}" for n in range(11, 1, -1)]
    assert 'href="?tag=bulk&amp;per=10&amp;page=2"' in html
    second = owner_client.get("/calls/?tag=bulk&per=10&page=2")
    assert "11–12 of 12" in second.content.decode()
    assert _names(second) == ["call 01", "call 00"]


def test_an_unknown_page_size_falls_back_to_the_default(owner_client, world):
    make_call("acme", name="one", due_in=HOUR)
    assert owner_client.get("/calls/?per=7").context["per_page"] == 25


def test_an_empty_list_invites_to_create_a_call(owner_client, world):
    html = owner_client.get("/calls/").content.decode()
    assert "No calls yet." in html
    assert "0 of 0" in html
