"""Login, logout and the header's tenant switcher."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from eventservice.dashboard.tenancy import tenant_switch
from eventservice.dashboard.views.common import redirect_back


class LoginView(auth_views.LoginView):
    template_name = "registration/login.html"
    redirect_authenticated_user = True


@require_POST
@login_required
def switch_tenant(request: HttpRequest) -> HttpResponse:
    tenant_id = request.POST.get("tenant", "")
    if tenant_switch(request, tenant_id):
        # Filters and calls of the previous tenant mean nothing under the new one.
        return HttpResponseRedirect(reverse("dashboard:calls"))
    messages.error(request, "You are not a member of that tenant.")
    return redirect_back(request, reverse("dashboard:calls"))
