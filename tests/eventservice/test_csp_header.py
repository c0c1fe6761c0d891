"""eventservice.middleware.ContentSecurityPolicyMiddleware: a response that asks for nothing of
its own gets the settings' policy built once per process, exactly as django-csp builds it; a
page with a nonce, an admin page, a response with a policy of its own and a change of the
settings still go through django-csp (docs/security.md, "Deployment hardening")."""

from __future__ import annotations

import pytest
from csp.exceptions import CSPNonceError
from csp.utils import build_policy
from django.http import HttpResponse
from django.test import RequestFactory, override_settings

from eventservice.middleware import ContentSecurityPolicyMiddleware

HEADER = "Content-Security-Policy"
REPORT_ONLY = "Content-Security-Policy-Report-Only"


@pytest.mark.django_db
def test_an_api_answer_and_a_page_without_a_nonce_get_the_settings_policy(client):
    expected = build_policy()
    assert "script-src 'self'" in expected and "nonce" not in expected
    for path in ("/api/tenants/acme/service-calls", "/accounts/login/"):
        first, second = client.get(path), client.get(path)
        assert first[HEADER] == second[HEADER] == expected, path
        assert REPORT_ONLY not in first


@pytest.mark.django_db
def test_a_page_with_a_nonce_gets_a_new_one_each_time(client):
    first, second = client.get("/api/docs/"), client.get("/api/docs/")
    assert first.status_code == 200
    assert "'nonce-" in first[HEADER] and first[HEADER] != second[HEADER]


@pytest.mark.django_db
def test_an_admin_page_keeps_its_style_attribute_exception(admin_client):
    assert "style-src-attr 'unsafe-inline'" in admin_client.get("/admin/")[HEADER]


@pytest.mark.django_db
def test_a_change_of_the_settings_changes_the_policy(client):
    before = client.get("/accounts/login/")[HEADER]
    policy = {"DIRECTIVES": {"default-src": ["'none'"]}}
    with override_settings(CONTENT_SECURITY_POLICY=policy, CONTENT_SECURITY_POLICY_REPORT_ONLY=policy):
        changed = client.get("/accounts/login/")
        assert changed[HEADER] == changed[REPORT_ONLY] == "default-src 'none'"
    assert client.get("/accounts/login/")[HEADER] == before


def _through_middleware(response: HttpResponse, path: str = "/api/x"):
    request = RequestFactory().get(path)
    middleware = ContentSecurityPolicyMiddleware(lambda request: response)
    return request, middleware(request)


def test_a_response_with_a_policy_of_its_own_goes_through_django_csp():
    exempt = HttpResponse()
    exempt._csp_exempt = True
    assert HEADER not in _through_middleware(exempt)[1]
    replaced = HttpResponse()
    replaced._csp_replace = {"img-src": ["'none'"]}
    assert "img-src 'none'" in _through_middleware(replaced)[1][HEADER]
    kept = HttpResponse()
    kept[HEADER] = "default-src 'none'"
    assert _through_middleware(kept)[1][HEADER] == "default-src 'none'"

    class Exempt(HttpResponse):
        _csp_exempt = True  # on the class, as django-csp reads it too

    assert HEADER not in _through_middleware(Exempt())[1]


def test_a_nonce_asked_for_after_the_header_went_out_is_an_error():
    request, response = _through_middleware(HttpResponse())
    assert response[HEADER] == build_policy()
    with pytest.raises(CSPNonceError):
        str(request.csp_nonce)
