"""Helpers shared by the dashboard's views."""

from __future__ import annotations

import uuid

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.utils.http import url_has_allowed_host_and_scheme

from core.errors import NotFound
from core.secrets import SecretUnavailable, seal_value, unseal_value
from eventservice.dashboard.selectors import call_tenant_id
from eventservice.dashboard.tenancy import member_tenant
from orchestration.models import ServiceCall
from orchestration.selectors import service_call_get


def call_for_request(request: HttpRequest, service_call_id: uuid.UUID) -> ServiceCall:
    """The call if it belongs to one of the user's tenants, else 404.

    A call of another of the user's tenants is shown as it is, and the page offers the switch
    (request.other_tenant): opening a link must not change the current tenant (tenancy.py).
    """
    tenant_id = call_tenant_id(service_call_id=service_call_id, tenant_ids=[t.id for t in request.tenants])
    if tenant_id is None:
        raise Http404("No such service call.")
    if tenant_id != request.tenant.id:
        request.other_tenant = member_tenant(request, tenant_id)
    try:
        return service_call_get(tenant_id=tenant_id, service_call_id=service_call_id)
    except NotFound:
        raise Http404("No such service call.") from None


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def redirect_back(request: HttpRequest, fallback: str) -> HttpResponse:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = fallback
    return HttpResponseRedirect(target)


def json_error(message: str, *, status: int, errors: dict | None = None) -> JsonResponse:
    return JsonResponse({"detail": message, "errors": errors or {}}, status=status)


# A secret made by a POST (a webhook's or the calls' signing secret), kept for the page the POST
# redirects to, which shows it once (docs/security.md, "Secrets shown once").
SECRET_SESSION_KEY = "dashboard.new_secret"


def keep_secret_once(request: HttpRequest, owner: str, secret: str) -> None:
    """Keep `secret` for `owner`'s next page: sealed as every stored secret is (core.secrets), so
    the session row never holds it readable."""
    request.session[SECRET_SESSION_KEY] = {"owner": owner, "sealed": seal_value(secret)}


def take_secret(request: HttpRequest, owner: str) -> str | None:
    """The secret kept for `owner`'s page, removed as it is read; None if there is none (or it
    was kept for another page)."""
    kept = request.session.get(SECRET_SESSION_KEY)
    if not isinstance(kept, dict) or kept.get("owner") != owner:
        return None
    del request.session[SECRET_SESSION_KEY]
    try:
        return unseal_value(kept["sealed"])
    except (KeyError, TypeError, SecretUnavailable):  # the keys were rotated in between: it is gone
        return None
