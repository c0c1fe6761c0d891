from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from eventservice.api import (  # noqa: F401 (schema registers the auth scheme)
    connections,
    errors,
    flow_control,
    ops,
    schedules,
    schema,
    service_calls,
    signing,
    subscriptions,
)

app_name = "api"

TENANT = "api/tenants/<str:tenant_id>"
CALL = f"{TENANT}/service-calls/<str:service_call_id>"
SUBSCRIPTION = f"{TENANT}/subscriptions/<str:subscription_id>"

urlpatterns = [
    path(f"{TENANT}/service-calls", service_calls.ServiceCallsApi.as_view(), name="service-calls"),
    path(f"{TENANT}/service-calls/batch", service_calls.ServiceCallBatchApi.as_view(), name="service-calls-batch"),
    path(f"{TENANT}/service-calls/bulk", service_calls.ServiceCallBulkApi.as_view(), name="service-calls-bulk"),
    path(CALL, service_calls.ServiceCallDetailApi.as_view(), name="service-call-detail"),
    path(f"{CALL}/tags", service_calls.ServiceCallTagsApi.as_view(), name="service-call-tags"),
    path(f"{CALL}/rerun", service_calls.ServiceCallRerunApi.as_view(), name="service-call-rerun"),
    path(f"{CALL}/cancel", service_calls.ServiceCallCancelApi.as_view(), name="service-call-cancel"),
    path(f"{TENANT}/events", service_calls.TenantEventsApi.as_view(), name="tenant-events"),
    path(f"{TENANT}/flow-control", flow_control.FlowControlApi.as_view(), name="flow-control"),
    path(f"{TENANT}/signing", signing.SigningApi.as_view(), name="signing"),
    path(f"{TENANT}/connections", connections.ConnectionsApi.as_view(), name="connections"),
    path(f"{TENANT}/connections/<str:name>", connections.ConnectionDetailApi.as_view(), name="connection-detail"),
    # Subscriptions' operations are fixed suffixes of its path (delivery.representation builds
    # the links that way).
    path(f"{TENANT}/subscriptions", subscriptions.SubscriptionsApi.as_view(), name="subscriptions"),
    path(SUBSCRIPTION, subscriptions.SubscriptionDetailApi.as_view(), name="subscription-detail"),
    path(
        f"{SUBSCRIPTION}/rotate-secret",
        subscriptions.SubscriptionRotateSecretApi.as_view(),
        name="subscription-rotate-secret",
    ),
    path(f"{SUBSCRIPTION}/test", subscriptions.SubscriptionTestApi.as_view(), name="subscription-test"),
    path(f"{SUBSCRIPTION}/recover", subscriptions.SubscriptionRecoverApi.as_view(), name="subscription-recover"),
    path(
        f"{SUBSCRIPTION}/deliveries",
        subscriptions.SubscriptionDeliveriesApi.as_view(),
        name="subscription-deliveries",
    ),
    path(
        f"{TENANT}/deliveries/<str:notification_id>/resend",
        subscriptions.DeliveryResendApi.as_view(),
        name="delivery-resend",
    ),
    # Recurring schedules (docs/schedules.md); the preview before the schedule's own path.
    path(f"{TENANT}/schedules", schedules.SchedulesApi.as_view(), name="schedules"),
    path(f"{TENANT}/schedules/preview", schedules.SchedulePreviewApi.as_view(), name="schedule-preview"),
    path(f"{TENANT}/schedules/<str:schedule_id>", schedules.ScheduleDetailApi.as_view(), name="schedule-detail"),
    path(
        f"{TENANT}/schedules/<str:schedule_id>/backfill",
        schedules.ScheduleBackfillApi.as_view(),
        name="schedule-backfill",
    ),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    # Any other /api/ path is a problem+json 404 (but /api/docs and /api/schema get the slash).
    re_path(r"^api/(?!docs$|schema$)", errors.ApiNotFound.as_view(), name="not-found"),
    path("healthz", ops.healthz, name="healthz"),
    path("metrics", ops.metrics, name="metrics"),
]
