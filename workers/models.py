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


class LoopRun(models.Model):
    class Loop(models.TextChoices):
        TIMER = "timer"
        EXECUTION = "execution"
        DISPATCH = "dispatch"
        DELIVERY = "delivery"
        WATCHDOG = "watchdog"
        RETENTION = "retention"
        SCHEDULES = "schedules"
        FLOW = "flow"
        BACKLOG = "backlog"

    session = models.ForeignKey(WorkerSession, on_delete=models.CASCADE, related_name="runs")
    loop = models.CharField(max_length=16, choices=Loop.choices)
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
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    loop__in=[
                        "timer",
                        "execution",
                        "dispatch",
                        "delivery",
                        "watchdog",
                        "retention",
                        "schedules",
                        "flow",
                        "backlog",
                    ]
                ),
                name="worker_loop_runs_loop_valid",
            ),
        ]
        indexes = [
            # Retention and the system page's recent runs.
            models.Index(fields=["started_at"], name="worker_loop_runs_started"),
            models.Index(fields=["loop", "-started_at"], name="worker_loop_runs_by_loop"),
        ]

    def __str__(self) -> str:
        return f"{self.loop} run at {self.started_at:%H:%M:%S}"
