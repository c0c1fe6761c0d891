"""URLs of the browser dashboard (mounted at the site root)."""

from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from eventservice.dashboard.views import accounts, calls, details, request_page, system

app_name = "dashboard"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard:calls"), name="home"),
    path("login/", accounts.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/", accounts.switch_tenant, name="switch-tenant"),
    path("calls/", calls.calls_page, name="calls"),
    path("calls/live", calls.calls_live, name="calls-live"),
    path("calls/new/", request_page.request_page, name="request"),
    path("calls/<uuid:service_call_id>/", details.call_detail, name="call-detail"),
    path("calls/<uuid:service_call_id>/live", details.call_live, name="call-live"),
    path("calls/<uuid:service_call_id>/tags", details.call_tags, name="call-tags"),
    path("calls/<uuid:service_call_id>/favorite", details.call_favorite, name="call-favorite"),
    path("calls/<uuid:service_call_id>/rerun", details.call_rerun, name="call-rerun"),
    path("system/", system.system_page, name="system"),
]
