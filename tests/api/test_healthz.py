"""GET /healthz: database, worker heartbeat, timer and outbox backlog; 200 or 503."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from core.ids import utcnow
from tests.support.api import submit_via_api
from workers.models import WorkerSession


def _session(*, beat_seconds_ago: float, status=WorkerSession.Status.RUNNING, id="w-1") -> WorkerSession:
    now = utcnow()
    return WorkerSession.objects.create(
        id=id,
        hostname="host",
        pid=1,
        started_at=now - timedelta(minutes=5),
        last_heartbeat_at=now - timedelta(seconds=beat_seconds_ago),
        status=status,
    )


def test_it_is_503_without_any_worker(db):
    response = Client().get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert body["database"]["ok"] is True
    assert body["worker"]["ok"] is False and body["worker"]["heartbeatAgeSeconds"] is None
    assert body["status"] == "degraded"


def test_it_is_200_with_a_fresh_worker_heartbeat(db):
    _session(beat_seconds_ago=1)

    response = Client().get("/healthz")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["worker"]["ok"] is True
    assert 0 <= body["worker"]["heartbeatAgeSeconds"] < 5
    assert body["worker"]["runningSessions"] == 1


def test_a_stale_or_stopped_worker_does_not_count(db, settings):
    _session(beat_seconds_ago=settings.WORKER_STALE_SECONDS + 5, id="stale")
    _session(beat_seconds_ago=0, status=WorkerSession.Status.SUCCESS, id="stopped")

    response = Client().get("/healthz")

    assert response.status_code == 503
    assert response.json()["worker"]["heartbeatAgeSeconds"] > settings.WORKER_STALE_SECONDS


def test_it_reports_timer_and_outbox_backlog_without_tenant_data(acme_api):
    submit_via_api(acme_api, name="Secret project name", tags=["internal-tag"])
    _session(beat_seconds_ago=0)

    response = Client().get("/healthz")

    body = response.json()
    assert body["timers"]["scheduled"] == 1 and body["timers"]["overdue"] == 1
    assert body["outbox"]["unpublished"] == 2 and body["outbox"]["oldestUnpublishedAgeSeconds"] >= 0
    text = response.content.decode()
    assert "acme" not in text and "Secret project" not in text and "internal-tag" not in text
    assert response["Cache-Control"].startswith("max-age=0")
    assert response["X-Correlation-Id"]


@pytest.mark.also_postgres
def test_it_names_the_database_server_and_the_nats_servers_without_credentials(db, settings):
    # docs/deploy.md, "High availability": which host of several the agent is on.
    from django.db import connection

    settings.NATS_URL = "nats://agent:secret@nats1.internal:4222, nats://nats2.internal:4222"
    body = Client().get("/healthz").json()
    if connection.vendor == "postgresql":
        info = connection.connection.info
        assert body["database"] == {
            "ok": True,
            "engine": "postgresql",
            "server": f"{info.host}:{info.port}",
            "primary": True,
        }
    else:
        assert body["database"] == {"ok": True, "engine": "sqlite"}
    assert body["nats"] == {"servers": ["nats://nats1.internal:4222", "nats://nats2.internal:4222"]}
    assert "secret" not in str(body)
