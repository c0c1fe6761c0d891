"""Every API endpoint keeps tenants apart: 404 (never 403) for anything not yours, 401 for
no credentials, and browser sessions of members work (with CSRF on writes)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.support.api import ApiClient, assert_problem, call_url, calls_url, session_api, stored_counts, submit_via_api

UNKNOWN_CALL = "0190a000-0000-7000-8000-000000000000"


def _endpoints(call_id: str, tenant: str = "acme"):
    """(name, method, url, body) of every tenant-scoped operation."""
    return [
        ("list", "get", calls_url(tenant), None),
        (
            "submit",
            "post",
            calls_url(tenant),
            {"name": "x", "requestSpec": {"method": "GET", "url": "http://127.0.0.1:9/"}},
        ),
        ("detail", "get", call_url(call_id, tenant), None),
        ("tags", "put", call_url(call_id, tenant, "/tags"), {"tags": ["x"]}),
        ("rerun", "post", call_url(call_id, tenant, "/rerun"), None),
        ("cancel", "post", call_url(call_id, tenant, "/cancel"), None),
        ("events", "get", f"/api/tenants/{tenant}/events", None),
        ("flow-control", "get", f"/api/tenants/{tenant}/flow-control", None),
        ("flow-control-put", "put", f"/api/tenants/{tenant}/flow-control", {"parallelism": 1}),
    ]


NAMES = ["list", "submit", "detail", "tags", "rerun", "cancel", "events", "flow-control", "flow-control-put"]


def _call(api: ApiClient, method: str, url: str, body):
    return getattr(api, method)(url, body) if method != "get" else api.get(url)


@pytest.fixture
def acme_call(acme_api):
    return submit_via_api(acme_api, tags=["mine"])["serviceCallId"]


@pytest.mark.parametrize("name", NAMES)
def test_another_tenants_key_on_my_path_is_404(globex_api, acme_call, name):
    _, method, url, body = next(e for e in _endpoints(acme_call) if e[0] == name)
    before = stored_counts()

    response = _call(globex_api, method, url, body)

    assert_problem(response, 404)
    assert stored_counts() == before


@pytest.mark.parametrize("name", ["detail", "tags", "rerun", "cancel"])
def test_my_key_on_another_tenants_call_id_is_404(globex_api, acme_call, name):
    # globex's own path, acme's call id: the call does not exist for globex.
    _, method, url, body = next(e for e in _endpoints(acme_call, "globex") if e[0] == name)
    before = stored_counts()

    response = _call(globex_api, method, url, body)

    body = assert_problem(response, 404)
    assert "acme" not in body["detail"]
    assert stored_counts() == before


def test_other_tenants_calls_and_events_never_show_in_my_lists(globex_api, acme_call):
    assert globex_api.get(calls_url("globex")).json()["results"] == []
    assert globex_api.get(calls_url("globex"), {"tag": "mine"}).json()["results"] == []
    assert globex_api.get("/api/tenants/globex/events").json()["data"] == []


@pytest.mark.parametrize("name", NAMES)
def test_a_session_user_outside_the_tenant_gets_404(world, acme_call, name):
    _, method, url, body = next(e for e in _endpoints(acme_call) if e[0] == name)
    before = stored_counts()

    response = _call(session_api(world.outsider), method, url, body)

    assert_problem(response, 404)
    assert stored_counts() == before


def test_non_superuser_staff_of_another_tenant_gets_404(world, acme_call):
    assert_problem(session_api(world.staff_globex).get(call_url(acme_call)), 404)


@pytest.mark.parametrize("name", NAMES)
def test_a_session_member_of_the_tenant_may_use_every_endpoint(world, acme_call, name):
    _, method, url, body = next(e for e in _endpoints(acme_call) if e[0] == name)

    response = _call(session_api(world.member), method, url, body)

    assert response.status_code in (200, 202), response.content


@pytest.mark.parametrize("name", NAMES)
def test_no_credentials_is_401_with_www_authenticate(anonymous_api, acme_call, name):
    _, method, url, body = next(e for e in _endpoints(acme_call) if e[0] == name)
    before = stored_counts()

    response = _call(anonymous_api, method, url, body)

    assert_problem(response, 401)
    assert response["WWW-Authenticate"] == "Bearer"
    assert stored_counts() == before


def test_an_unknown_or_revoked_key_is_401(world, acme_call):
    from django.utils import timezone

    from tenants.models import ApiKey

    assert_problem(ApiClient("sa_not-a-real-key").get(calls_url()), 401)
    ApiKey.objects.filter(tenant_id="acme").update(revoked_at=timezone.now())
    assert_problem(ApiClient(world.acme_key).get(calls_url()), 401)


def test_an_unknown_tenant_is_404_even_for_a_valid_key(acme_api, world):
    assert_problem(acme_api.get(calls_url("no-such-tenant")), 404)


def test_session_writes_need_the_csrf_token(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.member)
    api = ApiClient(None, client)
    payload = {"name": "x", "requestSpec": {"method": "GET", "url": "http://127.0.0.1:9/"}}
    before = stored_counts()

    refused = api.post(calls_url(), payload)

    assert_problem(refused, 403)
    assert stored_counts() == before
    token = "a" * 32
    client.cookies["csrftoken"] = token
    accepted = api.post(calls_url(), payload, headers={"X-CSRFToken": token})
    assert accepted.status_code == 202, accepted.content


def test_api_keys_need_no_csrf_token(world):
    api = ApiClient(world.acme_key, Client(enforce_csrf_checks=True))
    response = api.post(calls_url(), {"name": "x", "requestSpec": {"method": "GET", "url": "http://127.0.0.1:9/"}})
    assert response.status_code == 202
