"""Read-only figures of the system's health, for /healthz and /metrics.

No tenant data: counts, ages and heartbeats only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count

from core.ids import iso_ms, utcnow
from delivery.nats_subjects import nats_servers as servers_of
from delivery.nats_subjects import without_credentials
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


def database_server() -> dict[str, Any]:
    """Which database this process is on: on PostgreSQL the host and port of its connection
    (with several hosts in DATABASE_URL, the one libpq chose: docs/deploy.md, "High
    availability") and whether it takes writes; never a user or password."""
    if connection.vendor != "postgresql":
        return {"engine": connection.vendor}
    connection.ensure_connection()
    info = connection.connection.info
    with connection.cursor() as cursor:
        cursor.execute("SELECT NOT pg_is_in_recovery()")
        primary = cursor.fetchone()[0]
    return {"engine": "postgresql", "server": f"{info.host}:{info.port}", "primary": primary}


def nats_servers() -> list[str]:
    """The NATS servers of NATS_URL, without credentials (none when NATS is not used)."""
    return [without_credentials(server) for server in servers_of(settings.NATS_URL)]


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
        "database": {"ok": True, **database_server()},
        "nats": {"servers": nats_servers()},
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
