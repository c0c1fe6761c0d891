"""The site's 404, 403 and 500 pages with DEBUG off: the dashboard's own (navigation, a way
back), problem+json under /api/, the admin's own look under /admin/; the 500 page without the
database."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext

from eventservice.dashboard.views import calls as calls_views
from eventservice.dashboard.views import errors
from tests.support.api import ApiClient
from tests.support.factories import HOUR, make_call, make_user


@pytest.fixture(autouse=True)
def _debug_off(settings):
    settings.DEBUG = False


def _templates(response) -> list[str]:
    return [template.name for template in response.templates]


def _assert_site_page(response, status: int, heading: str) -> str:
    assert response.status_code == status
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert f'<h1 id="error-h">{heading}</h1>' in html
    # The site's navigation, the tenant in the header, and a way back.
    assert '<nav class="mainnav" aria-label="Main">' in html
    assert ">Calls</a>" in html and ">New request</a>" in html
    assert 'class="tenant-name"' in html
    assert '<a class="btn btn-primary" href="/calls/">← Calls</a>' in html
    return html


def test_an_unknown_page_is_the_sites_404(owner_client, world):
    response = owner_client.get("/no-such-page/")
    html = _assert_site_page(response, 404, "Page not found")
    assert "404.html" in _templates(response) and "base.html" in _templates(response)
    assert "/no-such-page/" in html


def test_another_tenants_call_is_the_same_404_and_names_nothing_of_it(owner_client, world):
    theirs = make_call("globex", name="globex launch plan", due_in=HOUR)
    html = _assert_site_page(owner_client.get(f"/calls/{theirs.pk}/"), 404, "Page not found")
    assert "globex launch plan" not in html
    _assert_site_page(owner_client.get(f"/calls/{uuid.uuid4()}/"), 404, "Page not found")


def test_a_staff_page_for_a_member_is_the_sites_403(owner_client, world):
    response = owner_client.get("/system/")
    _assert_site_page(response, 403, "Not allowed")
    assert "403.html" in _templates(response)


def test_an_expired_form_is_the_sites_csrf_page(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.owner)
    call = make_call("acme", name="kept", due_in=HOUR)
    response = client.post(f"/calls/{call.pk}/rerun")
    assert response.status_code == 403
    assert "This form can no longer be sent" in response.content.decode()
    assert "403_csrf.html" in _templates(response)


def test_the_api_keeps_answering_problem_json(world):
    acme_api = ApiClient(world.acme_key)
    for path in ("/api/", "/api/tenants/acme/service-calls/not-a-call", "/api/tenants/acme/nothing"):
        response = acme_api.get(path)
        assert response.status_code == 404, path
        assert response["Content-Type"] == "application/problem+json", path
        assert response.json()["correlationId"] == response["X-Correlation-Id"]


def test_api_errors_raised_outside_its_views_are_problem_json_too(world):
    request = RequestFactory().get("/api/tenants/acme/service-calls")
    request.correlation_id = "trace-7"
    for response, status in (
        (errors.bad_request(request, Exception()), 400),
        (errors.page_not_found(request, Exception()), 404),
        (errors.permission_denied(request, Exception()), 403),
        (errors.server_error(request), 500),
    ):
        assert response.status_code == status
        assert response["Content-Type"] == "application/problem+json"
        body = json.loads(response.content)
        assert body["correlationId"] == "trace-7" and body["status"] == status


@pytest.mark.parametrize("host", ["", "evil.example", "bad host"])
def test_a_host_header_django_refuses_is_a_400_problem_under_the_api_and_its_page_elsewhere(world, host):
    api = Client().get("/api/tenants/acme/service-calls", HTTP_HOST=host, HTTP_AUTHORIZATION=f"Bearer {world.acme_key}")
    assert api.status_code == 400
    assert api["Content-Type"] == "application/problem+json"
    assert api.json()["status"] == 400 and api.json()["correlationId"] == api["X-Correlation-Id"]
    assert api.json()["type"].endswith(":malformed-request")

    page = Client().get("/calls/", HTTP_HOST=host)
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")


def test_the_admin_keeps_its_own_pages(world):
    superuser = make_user("root", superuser=True)
    client = Client()
    client.force_login(superuser)

    missing = client.get("/admin/no-such-app/")
    assert missing.status_code == 404
    assert "admin/404.html" in _templates(missing) and "404.html" not in _templates(missing)
    assert "Service Agent administration" in missing.content.decode()

    refused = client.get("/admin/orchestration/servicecall/add/")
    assert refused.status_code == 403
    assert "admin/403.html" in _templates(refused)
    assert "Service Agent administration" in refused.content.decode()


def test_a_server_error_is_the_sites_500_page_rendered_without_the_database(world, monkeypatch):
    client = Client(raise_request_exception=False)
    client.force_login(world.owner)
    client.get("/calls/")  # the first visit stores the current tenant in the session
    queries_before_failure: list[int] = []

    def broken(**kwargs):
        queries_before_failure.append(len(connection.queries_log))
        raise RuntimeError("db password is hunter2")

    monkeypatch.setattr(calls_views, "service_calls_for_tenant", broken)
    with CaptureQueriesContext(connection):
        connection.queries_log.clear()
        response = client.get("/calls/", headers={"X-Correlation-Id": "trace-500"})
        queries_after = len(connection.queries_log)

    assert response.status_code == 500
    html = response.content.decode()
    assert "Something went wrong" in html and "trace-500" in html
    assert '<a class="btn btn-primary" href="/calls/">← Calls</a>' in html
    assert "hunter2" not in html and "Traceback" not in html
    assert queries_before_failure[0] > 0 and queries_after == queries_before_failure[0]  # none after the failure


def test_the_500_page_needs_no_database_at_all(django_db_blocker):
    request = RequestFactory().get("/calls/")
    request.correlation_id = "trace-9"
    with django_db_blocker.block():
        response = errors.server_error(request)
    assert response.status_code == 500
    assert "Something went wrong" in response.content.decode()
