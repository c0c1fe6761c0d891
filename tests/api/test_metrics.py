"""GET /metrics: Prometheus text format with calls, backlogs, heartbeat, attempts and delivery."""

from __future__ import annotations

import math
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from core.ids import utcnow
from delivery.models import Notification
from delivery.services import nats_subscription_ensure
from execution.outcomes import ErrorKind, Outcome
from orchestration.services import service_call_finish, service_call_start
from tests.support.api import submit_via_api
from tests.support.factories import HOUR, make_call
from tests.support.plans import query_plan, recorded_queries, selects_from
from tests.support.subscriptions import fan_out, make_subscription, record_try
from workers.models import WorkerSession


def _metrics(client: Client | None = None) -> dict[str, dict[tuple, float]]:
    response = (client or Client()).get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    families = {}
    for family in text_string_to_metric_families(response.content.decode()):
        families[family.name] = {tuple(sorted(s.labels.items())): s.value for s in family.samples}
    return families


def test_it_exposes_the_figures_in_prometheus_text_format(acme_api):
    for name in ("a", "b", "c"):
        submit_via_api(acme_api, name=name)
    running = submit_via_api(acme_api, name="runs")["serviceCallId"]
    assert service_call_start(tenant_id="acme", service_call_id=uuid.UUID(running))
    failed = service_call_start(tenant_id="acme", service_call_id=uuid.UUID(submit_via_api(acme_api)["serviceCallId"]))
    service_call_finish(
        tenant_id="acme", service_call_id=failed.service_call_id, outcome=Outcome.failure(ErrorKind.TIMEOUT, "slow")
    )
    now = utcnow()
    WorkerSession.objects.create(
        id="w", hostname="h", pid=1, started_at=now, last_heartbeat_at=now - timedelta(seconds=3)
    )

    m = _metrics()

    calls = m["serviceagent_service_calls"]
    assert calls[(("status", "Scheduled"),)] == 3
    assert calls[(("status", "Running"),)] == 1
    assert calls[(("status", "Failed"),)] == 1
    assert calls[(("status", "Succeeded"),)] == 0
    # Calls started directly here leave their timers armed (a later firing is a no-op).
    assert m["serviceagent_timers_scheduled"][()] == 5
    assert m["serviceagent_outbox_unpublished"][()] == 5 * 2 + 2 + 1
    assert m["serviceagent_outbox_lag_seconds"][()] >= 0
    assert 3 <= m["serviceagent_worker_heartbeat_age_seconds"][()] < 10
    assert m["serviceagent_worker_sessions_running"][()] == 1
    assert set(m["serviceagent_attempts"]) == {(("error_kind", k),) for k in ["none", *ErrorKind.values]}


def test_it_carries_no_tenant_data(acme_api):
    submit_via_api(acme_api, name="Secret project name")
    text = Client().get("/metrics").content.decode()
    assert "acme" not in text and "Secret project" not in text


def test_it_can_be_restricted_to_staff(world, settings):
    settings.METRICS_PUBLIC = False
    assert Client().get("/metrics").status_code == 404
    member = Client()
    member.force_login(world.member)
    assert member.get("/metrics").status_code == 404
    staff = Client()
    staff.force_login(world.staff_globex)
    assert "serviceagent_service_calls" in _metrics(staff)


def test_it_exposes_the_delivery_backlog_expired_and_lag_per_sink_kind(world, settings):
    settings.EVENT_DELIVERY_SCHEDULE = [300.0]
    hook, _ = make_subscription("acme", name="Secret hook name", url="http://127.0.0.1:9/acme-hook")
    settings.NATS_URL = "nats://127.0.0.1:4222"
    nats_subscription_ensure()  # operator-wide, every event type
    fan_out(make_call("acme", name="c", due_in=HOUR).pk)  # Submitted, Scheduled: 2 notifications per subscription
    submitted, scheduled = hook.notifications.order_by("event_seq")
    record_try(submitted, succeeded=True, status_code=204)
    record_try(scheduled, succeeded=False, status_code=503, error="503")
    nats_first = Notification.objects.filter(subscription__kind="nats").order_by("event_seq").first()
    record_try(nats_first, succeeded=False, error="no ack")
    record_try(nats_first, succeeded=False, error="no ack")  # the one-step schedule is used up

    m = _metrics()

    assert m["serviceagent_delivery_pending"] == {(("kind", "webhook"),): 0, (("kind", "nats"),): 1}
    assert m["serviceagent_delivery_failing"] == {(("kind", "webhook"),): 1, (("kind", "nats"),): 0}
    assert m["serviceagent_delivery_expired"] == {(("kind", "webhook"),): 0, (("kind", "nats"),): 1}
    assert 0 <= m["serviceagent_delivery_oldest_pending_seconds"][(("kind", "nats"),)] < 60
    assert m["serviceagent_delivery_oldest_pending_seconds"][(("kind", "webhook"),)] == 0
    lag = m["serviceagent_delivery_lag_seconds"]
    assert set(lag) == {(("kind", k), ("quantile", q)) for k in ("webhook", "nats") for q in ("0.5", "0.99")}
    assert 0 <= lag[(("kind", "webhook"), ("quantile", "0.5"))] <= lag[(("kind", "webhook"), ("quantile", "0.99"))] < 60
    text = Client().get("/metrics").content.decode()
    assert "acme" not in text and "Secret hook" not in text


def test_the_delivery_lag_is_nan_without_notifications_in_the_last_hour(world):
    lag = _metrics()["serviceagent_delivery_lag_seconds"]
    assert all(math.isnan(value) for value in lag.values())


@pytest.mark.skipif(connection.vendor != "sqlite", reason="plans asserted on SQLite")
def test_the_expired_count_and_the_lag_read_their_indexes(world):
    make_subscription("acme")
    with recorded_queries() as queries:
        _metrics()
    plans = ["\n".join(query_plan(*query)) for query in selects_from(queries, "event_notifications")]
    assert any("USING INDEX event_notifications_expired" in plan for plan in plans), plans
    lag_plans = [plan for plan in plans if "event_notifications_sub_new (subscription_id=? AND created_at>?)" in plan]
    assert len(lag_plans) == 2, plans  # one per kind
