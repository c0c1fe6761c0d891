"""GET /metrics: Prometheus text format with calls, backlogs, heartbeat and attempts."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from core.ids import utcnow
from execution.outcomes import ErrorKind, Outcome
from orchestration.services import service_call_finish, service_call_start
from tests.api.conftest import submit
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
        submit(acme_api, name=name)
    running = submit(acme_api, name="runs")["serviceCallId"]
    assert service_call_start(tenant_id="acme", service_call_id=uuid.UUID(running))
    failed = service_call_start(tenant_id="acme", service_call_id=uuid.UUID(submit(acme_api)["serviceCallId"]))
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
    submit(acme_api, name="Secret project name")
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
