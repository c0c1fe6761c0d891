"""The dashboard's current tenant: chosen in the header, kept in the session.

Only tenants the user belongs to can be chosen (superusers: any tenant); a stale or foreign
choice in the session falls back to the user's first tenant. Only a POST to the switcher
changes it: a GET never does, whatever link it came from (a page elsewhere could otherwise
flip a user's tenant before they submit a call), so a link naming another of the user's
tenants offers the switch instead (docs/security.md#6-deployment-hardening).
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest
from django.shortcuts import render

from tenants.models import Tenant
from tenants.selectors import tenants_for_user, user_can_access_tenant

SESSION_KEY = "dashboard.tenant_id"


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


def tenant_required(view):
    """Login required, and a current tenant on request.tenant (a page saying why if none)."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if resolve_tenant(request) is None:
            return render(request, "dashboard/no_tenant.html", status=403)
        return view(request, *args, **kwargs)

    return wrapper
