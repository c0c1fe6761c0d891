"""Reads of worker sessions and loop records, for /healthz, /metrics and the system page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from workers.models import LoopRun, WorkerSession


def worker_heartbeat(*, now: datetime) -> dict[str, Any]:
    """The freshest heartbeat of a running worker session (uses worker_sessions_running)."""
    running = WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING)
    newest = running.order_by("-last_heartbeat_at").values_list("last_heartbeat_at", flat=True).first()
    age = round((now - newest).total_seconds(), 3) if newest else None
    return {
        "running_sessions": running.count(),
        "heartbeat_age_seconds": age,
        "stale_after_seconds": settings.WORKER_STALE_SECONDS,
        "ok": age is not None and age <= settings.WORKER_STALE_SECONDS,
    }


@dataclass(frozen=True)
class WorkerRow:
    session: WorkerSession
    heartbeat_age_s: float
    stale: bool


def worker_sessions(*, now: datetime, limit: int = 20, stopped: int = 5) -> list[WorkerRow]:
    """Sessions still marked running (uses worker_sessions_running), then the last few stopped."""
    running = list(
        WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING).order_by("-last_heartbeat_at")[:limit]
    )
    ended = list(
        WorkerSession.objects.exclude(status=WorkerSession.Status.RUNNING).order_by("-last_heartbeat_at")[:stopped]
    )
    rows = []
    for session in running + ended:
        age = (now - session.last_heartbeat_at).total_seconds()
        stale = session.status == WorkerSession.Status.RUNNING and age > settings.WORKER_STALE_SECONDS
        rows.append(WorkerRow(session, age, stale))
    return rows


def recent_loop_errors(*, limit: int = 20) -> list[LoopRun]:
    return list(LoopRun.objects.filter(errors__gt=0).select_related("session").order_by("-started_at")[:limit])
