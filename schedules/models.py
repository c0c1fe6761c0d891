"""Recurring schedules: a cron in a time zone that makes one service call per occurrence
(docs/schedules.md). Written only by schedules.services; the calls are orchestration's."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from core.fields import JSONField
from orchestration.models import OVERLAP_POLICIES
from schedules.cron import DST_REPEATED, DST_SKIPPED, duration_text


class Schedule(models.Model):
    schedule_id = models.UUIDField(primary_key=True, editable=False)
    # No index of its own: schedules_tenant leads with it (core/schema.py).
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, db_column="tenant_id", related_name="+", db_index=False
    )
    name = models.CharField(max_length=200)
    # Five fields, normalised (schedules.cron.parse_cron), evaluated in `timezone`.
    cron = models.CharField(max_length=120, blank=True)
    # Or an interval schedule (`every`): an occurrence every this many seconds from its anchor
    # (start_at, else created_at to the second), in real time; cron is then empty.
    every_s = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    # The DST choices (schedules.cron: DST_SKIPPED, DST_REPEATED; docs/schedules.md).
    dst_skipped = models.CharField(max_length=16, default="afterJump")
    dst_repeated = models.CharField(max_length=8, default="once")
    # {method, url, headers, body, timeoutMs}, as a call's: secret header values sealed.
    request_spec = JSONField()
    tags = JSONField(default=list, blank=True)
    # A call's retry policy (docs/retries.md), given to every call made; null: one attempt.
    retry_policy = JSONField(null=True, blank=True)
    # No occurrence before start_at or after end_at (null: no bound).
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    # Why it is paused, shown wherever the pause shows (empty: no note).
    paused_note = models.CharField(max_length=500, blank=True, default="")
    # What an occurrence's call does when it falls due while an earlier call of the schedule is
    # still going (orchestration.models.OVERLAP_POLICIES; docs/schedules.md, "Overlap").
    overlap = models.CharField(max_length=12, default="skip")
    # Missed occurrences no older than this run once each, oldest first; older ones are skipped
    # (docs/schedules.md, "Missed occurrences").
    catchup_window_s = models.PositiveIntegerField(default=60)
    # Each occurrence's call is due this much later at most: an offset of its own, stable
    # (schedules.services.jitter_of), so a fleet of hourly schedules does not fire at once.
    jitter_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    # The last change by a user (the loop's progress does not count).
    updated_at = models.DateTimeField()
    # The latest occurrence made into a call: normally the next run, made ahead as Scheduled.
    last_occurrence_at = models.DateTimeField(null=True, blank=True)
    # Occurrences skipped and never run (docs/schedules.md), in all and by reason.
    skipped_count = models.PositiveIntegerField(default=0)
    skipped_reasons = JSONField(default=dict, blank=True)
    # When the loop makes the following call: the time of the call made ahead, so that the
    # next one is made as that one comes due. Null: nothing more to make (paused, or past
    # its end).
    advance_at = models.DateTimeField(null=True, blank=True)
    # Bumped by every write; the loop's update is conditional on the revision it planned from.
    revision = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "schedules"
        ordering = ["-schedule_id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(dst_skipped__in=list(DST_SKIPPED)) & Q(dst_repeated__in=list(DST_REPEATED)),
                name="schedules_dst_choices_valid",
            ),
            models.CheckConstraint(condition=Q(overlap__in=list(OVERLAP_POLICIES)), name="schedules_overlap_valid"),
            # A cron, or an interval: one of the two.
            models.CheckConstraint(
                condition=(Q(every_s__isnull=True) & ~Q(cron="")) | (Q(every_s__isnull=False) & Q(cron="")),
                name="schedules_cron_or_every",
            ),
            models.CheckConstraint(
                condition=Q(start_at__isnull=True) | Q(end_at__isnull=True) | Q(end_at__gt=F("start_at")),
                name="schedules_end_after_start",
            ),
            models.CheckConstraint(
                condition=Q(paused=False) | Q(advance_at__isnull=True),
                name="schedules_paused_not_advancing",
            ),
        ]
        indexes = [
            # The list: WHERE tenant_id=? ORDER BY schedule_id DESC (cursor pages).
            models.Index(fields=["tenant", "-schedule_id"], name="schedules_tenant"),
            # schedules_materialize: WHERE advance_at <= ? ORDER BY advance_at, active ones only.
            models.Index(fields=["advance_at"], condition=Q(advance_at__isnull=False), name="schedules_advance"),
        ]

    @property
    def plan_text(self) -> str:
        """What makes its occurrences, as the pages show it: the cron, or `every 15m`."""
        return f"every {duration_text(self.every_s)}" if self.every_s else self.cron

    def __str__(self) -> str:
        return f"{self.name} ({self.plan_text} {self.timezone})"
