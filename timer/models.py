"""Durable one-shot timers; the table is the truth, the worker's heap only a cache."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class TimerSchedule(models.Model):
    class State(models.TextChoices):
        SCHEDULED = "Scheduled"
        REACHED = "Reached"

    # A growing sequence lets the worker read only timers registered since its last look.
    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (tenant, call) leads with it (core/schema.py,
    # DropForeignKeyIndex).
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, db_column="tenant_id", related_name="+", db_index=False
    )
    service_call = models.ForeignKey(
        "orchestration.ServiceCall",
        on_delete=models.CASCADE,
        db_column="service_call_id",
        related_name="+",
        db_constraint=True,
    )
    correlation_id = models.CharField(max_length=64)
    due_at = models.DateTimeField()
    registered_at = models.DateTimeField()
    reached_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.SCHEDULED)

    class Meta:
        db_table = "timer_schedules"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "service_call"], name="timer_schedules_key"),
            models.CheckConstraint(condition=Q(state__in=["Scheduled", "Reached"]), name="timer_schedules_state_valid"),
            models.CheckConstraint(
                condition=Q(state="Scheduled", reached_at__isnull=True) | Q(state="Reached", reached_at__isnull=False),
                name="timer_schedules_reached_at_set",
            ),
        ]
        indexes = [
            # Seed index: per-tenant polling and the admin's timer lists.
            models.Index(fields=["tenant", "state", "due_at"], name="timer_schedules_due_at"),
            # The worker's due query: WHERE state='Scheduled' AND due_at <= ? ORDER BY due_at.
            models.Index(fields=["due_at"], condition=Q(state="Scheduled"), name="timer_schedules_pending"),
            models.Index(fields=["correlation_id"], name="timer_schedules_correlation"),
        ]

    def __str__(self) -> str:
        return f"timer {self.service_call_id} due {self.due_at:%Y-%m-%d %H:%M:%S} ({self.state})"
