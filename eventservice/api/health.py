"""Read-only figures of the system's health, for /healthz and /metrics.

No tenant data: counts, ages and heartbeats only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count

from core.ids import iso_ms, utcnow
from execution.models import HttpExecution
from orchestration.selectors import status_counts
from outbox.selectors import outbox_backlog
from timer.selectors import timers_backlog
from workers.selectors import worker_heartbeat


def database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except Exception:
        return False


def _worker(now: datetime) -> dict[str, Any]:
    beat = worker_heartbeat(now=now)
    return {
        "runningSessions": beat["running_sessions"],
        "heartbeatAgeSeconds": beat["heartbeat_age_seconds"],
        "staleAfterSeconds": beat["stale_after_seconds"],
        "ok": beat["ok"],
    }


def _outbox(now: datetime) -> dict[str, Any]:
    backlog = outbox_backlog(now=now)
    age_ms = backlog["oldest_age_ms"]
    return {
        "unpublished": backlog["unpublished"],
        "oldestUnpublishedAgeSeconds": round(age_ms / 1000, 3) if age_ms else 0.0,
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
    worker = _worker(now)
    healthy = worker["ok"]
    return healthy, {
        "status": "ok" if healthy else "degraded",
        "checkedAt": iso_ms(now),
        "database": {"ok": True},
        "worker": worker,
        "timers": timers_backlog(now=now),
        "outbox": _outbox(now),
    }


def metrics_snapshot(*, now: datetime | None = None) -> dict[str, Any]:
    now = now or utcnow()
    return {
        "calls": status_counts(),
        "timers": timers_backlog(now=now),
        "outbox": _outbox(now),
        "worker": _worker(now),
        "attempts": attempts_by_error_kind(),
    }
