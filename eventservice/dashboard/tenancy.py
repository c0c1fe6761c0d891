"""The dashboard's current tenant: chosen in the header, kept in the session.

Only tenants the user belongs to can be chosen (superusers: any tenant); a stale or foreign
choice in the session falls back to the user's first tenant. Only a POST to the switcher
changes it: a GET never does, whatever link it came from (a page elsewhere could otherwise
flip a user's tenant before they submit a call), so a link naming another of the user's
tenants offers the switch instead (docs/security.md#6-deployment-hardening).
"""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from tenants.models import Tenant
from tenants.selectors import tenants_for_user, user_can_access_tenant

SESSION_KEY = "dashboard.tenant_id"
LAST_TENANT_COOKIE = "last_tenant"
_LAST_TENANT_SALT = "dashboard.last_tenant"
_LAST_TENANT_MAX_AGE = 365 * 24 * 3600


def tenant_choices(user) -> list[Tenant]:
    return list(tenants_for_user(user=user).order_by("id"))


def resolve_tenant(request: HttpRequest) -> Tenant | None:
    """The current tenant of this request, and request.tenants for the header's switcher."""
    tenants = tenant_choices(request.user)
    request.tenants = tenants
    chosen = request.session.get(SESSION_KEY)
    current = next((tenant for tenant in tenants if tenant.id == chosen), None)
    if current is None and tenants:
        current = tenants[0]
        request.session[SESSION_KEY] = current.id
    request.tenant = current
    return current


def member_tenant(request: HttpRequest, tenant_id: str) -> Tenant | None:
    """tenant_id if it is one of the user's tenants (after resolve_tenant), else None."""
    return next((tenant for tenant in request.tenants if tenant.id == tenant_id), None)


def tenant_switch(request: HttpRequest, tenant_id: str) -> bool:
    """Make tenant_id current if the user may act for it; False (and no change) otherwise.

    Only the switcher's POST calls this.
    """
    if not user_can_access_tenant(user=request.user, tenant_id=tenant_id):
        return False
    request.session[SESSION_KEY] = tenant_id
    return True


def remember_last_tenant(request: HttpRequest, response: HttpResponse) -> None:
    """Keep the user's current tenant on the response's cookie, for their next login."""
    value = f"{request.user.pk}:{request.session[SESSION_KEY]}"
    response.set_signed_cookie(
        LAST_TENANT_COOKIE,
        value,
        salt=_LAST_TENANT_SALT,
        max_age=_LAST_TENANT_MAX_AGE,
        secure=settings.SESSION_COOKIE_SECURE,
        httponly=True,
        samesite="Lax",
    )


def restore_last_tenant(request: HttpRequest) -> bool:
    """After login: the tenant of the cookie becomes current if it is this user's and still theirs."""
    value = request.get_signed_cookie(
        LAST_TENANT_COOKIE, default="", salt=_LAST_TENANT_SALT, max_age=_LAST_TENANT_MAX_AGE
    )
    user_pk, _, tenant_id = value.partition(":")
    if not tenant_id or user_pk != str(request.user.pk):
        return False
    return tenant_switch(request, tenant_id)


def tenant_required(view):
    """Login required, and a current tenant on request.tenant (a page saying why if none)."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if resolve_tenant(request) is None:
            return render(request, "dashboard/no_tenant.html", status=403)
        return view(request, *args, **kwargs)

    return wrapper
