"""The signed-calls page (docs/api.md, "Signed calls"): whether the current tenant's calls carry
Standard Webhooks headers, turned on, off, or rotated; a new secret shown once, on the page the
change leads to (kept sealed in the session until then: views.common.keep_secret_once). Thin:
execution.signing stores it, exactly as for the API."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from eventservice.dashboard.tenancy import tenant_required
from eventservice.dashboard.views.common import keep_secret_once, take_secret
from execution.signing import call_signing_get, call_signing_set

# What each button of the page asks for: (enabled, rotate), and what it says when done.
ACTIONS = {
    "enable": (True, False, "Each attempt of your calls is signed from now on."),
    "disable": (False, False, "Your calls are no longer signed."),
    "rotate": (True, True, "A new signing secret was made; the previous one keeps signing for 24 hours."),
}


@never_cache
@tenant_required
@require_http_methods(["GET", "POST"])
def signing_page(request: HttpRequest) -> HttpResponse:
    tenant_id = request.tenant.id
    if request.method == "POST":
        action = ACTIONS.get(request.POST.get("action", ""))
        if action is None:
            messages.error(request, "Nothing was changed: choose to sign your calls, stop, or rotate the secret.")
            return HttpResponseRedirect(reverse("dashboard:signing"))
        enabled, rotate, done = action
        if rotate and not call_signing_get(tenant_id=tenant_id).enabled:
            messages.error(request, "Nothing was changed: sign your calls first, then rotate the secret.")
            return HttpResponseRedirect(reverse("dashboard:signing"))
        _, secret = call_signing_set(tenant_id=tenant_id, enabled=enabled, rotate=rotate)
        if secret:
            keep_secret_once(request, f"call-signing:{tenant_id}", secret)
        messages.success(request, done)
        return HttpResponseRedirect(reverse("dashboard:signing"))
    return render(
        request,
        "dashboard/signing.html",
        {"state": call_signing_get(tenant_id=tenant_id), "secret": take_secret(request, f"call-signing:{tenant_id}")},
    )
