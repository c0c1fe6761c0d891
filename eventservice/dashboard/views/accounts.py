"""Login, logout and the header's tenant switcher."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from eventservice.dashboard.tenancy import remember_last_tenant, restore_last_tenant, tenant_switch
from eventservice.dashboard.views.common import redirect_back


class LoginView(auth_views.LoginView):
    template_name = "registration/login.html"
    redirect_authenticated_user = True

    def form_valid(self, form):
        response = super().form_valid(form)
        restore_last_tenant(self.request)
        return response


def login_locked_out(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """django-axes' lockout answer (AXES_LOCKOUT_CALLABLE): the login page saying why, 429."""
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    form = AuthenticationForm(request, initial={"username": username})
    context = {"form": form, "next": request.POST.get("next", ""), "locked_out_minutes": minutes}
    response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(minutes * 60)
    return response


@require_POST
@login_required
def switch_tenant(request: HttpRequest) -> HttpResponse:
    tenant_id = request.POST.get("tenant", "")
    if tenant_switch(request, tenant_id):
        # From the header: filters and calls of the previous tenant mean nothing under the new
        # one. From a link's prompt (`next`): back to that link, which names the new tenant.
        response = redirect_back(request, reverse("dashboard:calls"))
        remember_last_tenant(request, response)
        return response
    messages.error(request, "You are not a member of that tenant.")
    return redirect_back(request, reverse("dashboard:calls"))
