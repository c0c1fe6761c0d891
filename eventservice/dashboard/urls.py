"""URLs of the browser dashboard (mounted at the site root)."""

from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from eventservice.dashboard.views import (
    accounts,
    batch,
    bulk,
    calls,
    connections,
    details,
    flow_control,
    request_page,
    schedules,
    signing,
    subscriptions,
    system,
)

app_name = "dashboard"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard:calls"), name="home"),
    path("login/", accounts.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/", accounts.switch_tenant, name="switch-tenant"),
    path("calls/", calls.calls_page, name="calls"),
    path("calls/live", calls.calls_live, name="calls-live"),
    path("calls/bulk", bulk.calls_bulk, name="calls-bulk"),
    path("calls/new/", request_page.request_page, name="request"),
    path("calls/batch/", batch.batch_page, name="batch"),
    path("calls/<uuid:service_call_id>/", details.call_detail, name="call-detail"),
    path("calls/<uuid:service_call_id>/live", details.call_live, name="call-live"),
    path("calls/<uuid:service_call_id>/tags", details.call_tags, name="call-tags"),
    path("calls/<uuid:service_call_id>/favorite", details.call_favorite, name="call-favorite"),
    path("calls/<uuid:service_call_id>/rerun", details.call_rerun, name="call-rerun"),
    path("calls/<uuid:service_call_id>/cancel", details.call_cancel, name="call-cancel"),
    path("signing/", signing.signing_page, name="signing"),
    path("connections/", connections.connections_page, name="connections"),
    path("connections/<str:name>/", connections.connection_detail, name="connection-detail"),
    path("connections/<str:name>/delete", connections.connection_delete_view, name="connection-delete"),
    path("subscriptions/", subscriptions.subscriptions_page, name="subscriptions"),
    path("subscriptions/new/", subscriptions.subscription_new, name="subscription-new"),
    path("subscriptions/<uuid:subscription_id>/", subscriptions.subscription_detail, name="subscription-detail"),
    path(
        "subscriptions/<uuid:subscription_id>/enabled", subscriptions.subscription_enabled, name="subscription-enabled"
    ),
    path(
        "subscriptions/<uuid:subscription_id>/rotate-secret",
        subscriptions.subscription_rotate,
        name="subscription-rotate-secret",
    ),
    path("subscriptions/<uuid:subscription_id>/test", subscriptions.subscription_test, name="subscription-test"),
    path(
        "subscriptions/<uuid:subscription_id>/recover",
        subscriptions.subscription_recover_view,
        name="subscription-recover",
    ),
    path(
        "subscriptions/<uuid:subscription_id>/delete",
        subscriptions.subscription_delete_view,
        name="subscription-delete",
    ),
    path(
        "subscriptions/<uuid:subscription_id>/deliveries/<uuid:notification_id>/resend",
        subscriptions.delivery_resend,
        name="delivery-resend",
    ),
    path("flow-control/", flow_control.flow_control_page, name="flow-control"),
    path("schedules/", schedules.schedules_page, name="schedules"),
    path("schedules/new/", schedules.schedule_new, name="schedule-new"),
    path("schedules/<uuid:schedule_id>/", schedules.schedule_detail, name="schedule-detail"),
    path("schedules/<uuid:schedule_id>/paused", schedules.schedule_paused, name="schedule-paused"),
    path("schedules/<uuid:schedule_id>/delete", schedules.schedule_delete_view, name="schedule-delete"),
    path("schedules/<uuid:schedule_id>/backfill", schedules.schedule_backfill_view, name="schedule-backfill"),
    path("system/", system.system_page, name="system"),
]
