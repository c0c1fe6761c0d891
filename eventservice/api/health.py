"""Read-only figures of the system's health, for /healthz and /metrics.

No tenant data: counts, ages and heartbeats only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count

from eventservice.ids import iso_ms, utcnow
from execution.models import HttpExecution
from orchestration.selectors import status_counts
from outbox.models import OutboxEvent
from timer.selectors import timers_backlog
from workers.models import WorkerSession


def database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except Exception:
        return False


def worker_heartbeat(*, now: datetime) -> dict[str, Any]:
    """The freshest heartbeat of a running worker session (uses worker_sessions_running)."""
    running = WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING)
    newest = running.order_by("-last_heartbeat_at").values_list("last_heartbeat_at", flat=True).first()
    age = round((now - newest).total_seconds(), 3) if newest else None
    return {
        "runningSessions": running.count(),
        "heartbeatAgeSeconds": age,
        "staleAfterSeconds": settings.WORKER_STALE_SECONDS,
        "ok": age is not None and age <= settings.WORKER_STALE_SECONDS,
    }


def outbox_backlog(*, now: datetime) -> dict[str, Any]:
    """Unpublished events and the age of the oldest (uses outbox_unpublished)."""
    unpublished = OutboxEvent.objects.filter(published_at__isnull=True)
    oldest = unpublished.order_by("id").values_list("created_at", flat=True).first()
    return {
        "unpublished": unpublished.count(),
        "oldestUnpublishedAgeSeconds": round(max(0.0, (now - oldest).total_seconds()), 3) if oldest else 0.0,
    }


def attempts_by_error_kind() -> dict[str, int]:
    """Attempts in the (retained) log by error kind; successes are kind `none`."""
    rows = HttpExecution.objects.values_list("error_kind").annotate(n=Count("pk")).values_list("error_kind", "n")
    return {kind or "none": n for kind, n in rows}


def health_report(*, now: datetime | None = None) -> tuple[bool, dict[str, Any]]:
    """(healthy, body): healthy when the database answers and a worker beat recently."""
    now = now or utcnow()
    if not database_ok():
        return False, {"status": "unavailable", "checkedAt": iso_ms(now), "database": {"ok": False}}
    worker = worker_heartbeat(now=now)
    healthy = worker["ok"]
    return healthy, {
        "status": "ok" if healthy else "degraded",
        "checkedAt": iso_ms(now),
        "database": {"ok": True},
        "worker": worker,
        "timers": timers_backlog(now=now),
        "outbox": outbox_backlog(now=now),
    }


def metrics_snapshot(*, now: datetime | None = None) -> dict[str, Any]:
    now = now or utcnow()
    return {
        "calls": status_counts(),
        "timers": timers_backlog(now=now),
        "outbox": outbox_backlog(now=now),
        "worker": worker_heartbeat(now=now),
        "attempts": attempts_by_error_kind(),
    }
