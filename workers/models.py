"""Worker sessions with heartbeats, and records of loop runs.

What they hold and how long they are kept: docs/architecture.md, 'What the workers record'.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class WorkerSession(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCESS = "success"
        ERROR = "error"
        # Stopped beating without a clean shutdown (killed, power loss).
        UNKNOWN = "unknown"

    id = models.CharField(primary_key=True, max_length=64)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    error_type = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="")

    class Meta:
        db_table = "worker_sessions"
        ordering = ["-started_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["running", "success", "error", "unknown"]),
                name="worker_sessions_status_valid",
            ),
        ]
        indexes = [
            # Finding sessions that stopped beating.
            models.Index(
                fields=["last_heartbeat_at"],
                condition=Q(status="running"),
                name="worker_sessions_running",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid} ({self.status})"


def loop_choices() -> list[tuple[str, str]]:
    """The registered loops' run names (workers/loops/__init__.py). A callable, so that the
    field's migration names this function rather than the list: adding a loop needs none."""
    from workers.loops import registered

    return [(loop.run_name(), loop.run_name().title()) for loop in registered()]


class LoopRun(models.Model):
    session = models.ForeignKey(WorkerSession, on_delete=models.CASCADE, related_name="runs")
    # A registered loop's name: RunRecorder checks it (no CHECK constraint, so that adding a
    # loop needs no migration).
    loop = models.CharField(max_length=16, choices=loop_choices)
    started_at = models.DateTimeField()
    # One record covers the loop's runs in a short window (see RunRecorder).
    runs = models.PositiveIntegerField(default=1)
    duration_ms = models.FloatField()
    items = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    error_message = models.TextField(blank=True, default="")

    class Meta:
        db_table = "worker_loop_runs"
        ordering = ["-started_at"]
        indexes = [
            # Retention and the system page's recent runs.
            models.Index(fields=["started_at"], name="worker_loop_runs_started"),
            models.Index(fields=["loop", "-started_at"], name="worker_loop_runs_by_loop"),
        ]

    def __str__(self) -> str:
        return f"{self.loop} run at {self.started_at:%H:%M:%S}"
