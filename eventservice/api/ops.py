"""Operations endpoints: /healthz (for load balancers) and /metrics (for Prometheus).

Neither needs an API key and neither shows tenant data. /metrics is public unless
METRICS_PUBLIC=false, then only staff sessions may read it (others get 404).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from delivery.models import Subscription
from delivery.selectors import delivery_backlog, delivery_lag_by_kind, expired_counts
from eventservice.api.health import health_report, metrics_snapshot
from execution.outcomes import ErrorKind
from orchestration.models import ServiceCall
from schedules.selectors import skipped_occurrences_by_reason


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    healthy, body = health_report()
    return JsonResponse(body, status=200 if healthy else 503)


class ServiceAgentCollector:
    """Reads the figures from the database at scrape time (any process can serve them)."""

    def collect(self):
        snap = metrics_snapshot()

        calls = GaugeMetricFamily(
            "serviceagent_service_calls", "Service calls by status (all tenants).", labels=["status"]
        )
        for status in ServiceCall.Status.values:
            calls.add_metric([status], snap["calls"].get(status, 0))
        yield calls

        timers = snap["timers"]
        yield GaugeMetricFamily("serviceagent_timers_scheduled", "Timers not yet reached.", value=timers["scheduled"])
        yield GaugeMetricFamily(
            "serviceagent_timers_overdue", "Scheduled timers whose due time has passed.", value=timers["overdue"]
        )
        yield GaugeMetricFamily(
            "serviceagent_timers_oldest_overdue_seconds",
            "Age of the oldest overdue timer.",
            value=timers["oldestOverdueSeconds"],
        )

        outbox = snap["outbox"]
        yield GaugeMetricFamily(
            "serviceagent_outbox_unpublished", "Outbox events not yet published.", value=outbox["unpublished"]
        )
        yield GaugeMetricFamily(
            "serviceagent_outbox_lag_seconds",
            "Age of the oldest unpublished outbox event.",
            value=outbox["oldestUnpublishedAgeSeconds"],
        )

        worker = snap["worker"]
        yield GaugeMetricFamily(
            "serviceagent_worker_sessions_running",
            "Worker sessions marked running.",
            value=worker["runningSessions"],
        )
        age = worker["heartbeatAgeSeconds"]
        yield GaugeMetricFamily(
            "serviceagent_worker_heartbeat_age_seconds",
            "Seconds since the freshest running worker's heartbeat (NaN: no running worker).",
            value=float("nan") if age is None else age,
        )

        attempts = GaugeMetricFamily(
            "serviceagent_attempts",
            "Attempts in the retained execution log by error kind (none: succeeded).",
            labels=["error_kind"],
        )
        for kind in ["none", *ErrorKind.values]:
            attempts.add_metric([kind], snap["attempts"].get(kind, 0))
        yield attempts

        yield from delivery_metrics()

        skipped = GaugeMetricFamily(
            "serviceagent_schedule_occurrences_skipped",
            "Occurrences skipped, never run, by the schedules that exist, by reason (docs/schedules.md).",
            labels=["reason"],
        )
        for reason, count in sorted(skipped_occurrences_by_reason().items()):
            skipped.add_metric([reason], count)
        yield skipped


def delivery_metrics() -> Iterator[GaugeMetricFamily]:
    """Delivery to subscribers per sink kind (webhook, nats), read through delivery.selectors with
    queries on partial indexes: the backlog, the expired, and the lag over the last hour."""
    kinds = Subscription.Kind.values
    backlog = delivery_backlog()
    expired = expired_counts()
    lag = delivery_lag_by_kind()
    pending = GaugeMetricFamily(
        "serviceagent_delivery_pending", "Notifications PENDING: not tried yet, or requeued.", labels=["kind"]
    )
    failing = GaugeMetricFamily(
        "serviceagent_delivery_failing",
        "Notifications FAILED: their last try failed; tried again later.",
        labels=["kind"],
    )
    oldest = GaugeMetricFamily(
        "serviceagent_delivery_oldest_pending_seconds",
        "Age of the oldest PENDING notification (0: none).",
        labels=["kind"],
    )
    expired_family = GaugeMetricFamily(
        "serviceagent_delivery_expired", "Notifications EXPIRED: given up on (retained rows).", labels=["kind"]
    )
    lag_family = GaugeMetricFamily(
        "serviceagent_delivery_lag_seconds",
        "Delivery lag (event created -> delivered) of the notifications made in the last hour; one not"
        " delivered yet counts with its age so far (NaN: none).",
        labels=["kind", "quantile"],
    )
    for kind in kinds:
        pending.add_metric([kind], backlog[kind].pending)
        failing.add_metric([kind], backlog[kind].failing)
        oldest.add_metric([kind], backlog[kind].oldest_pending_age_s or 0.0)
        expired_family.add_metric([kind], expired[kind])
        for quantile, value in (("0.5", lag[kind].p50_s), ("0.99", lag[kind].p99_s)):
            lag_family.add_metric([kind, quantile], float("nan") if value is None else value)
    yield from (pending, failing, oldest, expired_family, lag_family)


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not settings.METRICS_PUBLIC and not (request.user.is_authenticated and request.user.is_staff):
        return HttpResponse(status=404)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceAgentCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
