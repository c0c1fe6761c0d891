"""Service calls and their tags; orchestration is the only writer of these tables."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from core.fields import JSONField
from execution.outcomes import ErrorKind

FAVORITE_TAG = "favorite"

# What a schedule's call does when it falls due while another call of its schedule is still
# going (docs/schedules.md, "Overlap"; orchestration.services.overlap decides).
OVERLAP_POLICIES = ("skip", "bufferOne", "allowAll", "cancelOther")


class OverlapState(models.TextChoices):
    """What a schedule's overlap policy did to the call (orchestration.services.overlap)."""

    NONE = ""
    BUFFERED = "buffered"  # it waited (or waits) for the schedule's earlier call
    SKIPPED = "skipped"  # cancelled, never ran: an earlier call was still going
    SUPERSEDED = "superseded"  # cancelled after trying: a later occurrence took over


class ServiceCall(models.Model):
    class Status(models.TextChoices):
        SCHEDULED = "Scheduled"
        RUNNING = "Running"
        SUCCEEDED = "Succeeded"
        FAILED = "Failed"
        CANCELLED = "Cancelled"

    TERMINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    OverlapState = OverlapState

    # A UUID v7 is unique on its own, so it is the Django primary key; the seed's composite
    # key (tenant_id, service_call_id) is kept as a unique constraint (docs/schema.md).
    service_call_id = models.UUIDField(primary_key=True, editable=False)
    # No index of its own: the unique (tenant_id, service_call_id) leads with it (core/schema.py,
    # DropForeignKeyIndex).
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, db_column="tenant_id", related_name="+", db_index=False
    )
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SCHEDULED)
    submitted_at = models.DateTimeField()
    due_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # {method, url, headers, body, timeoutMs}; secret header values are sealed at rest.
    request_spec = JSONField()
    # The outcome of a finished call; while a retry is Scheduled, the last attempt's error.
    outcome_meta = JSONField(null=True, blank=True)
    error_kind = models.CharField(max_length=16, choices=ErrorKind.choices, null=True, blank=True)
    correlation_id = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    # SHA-256 of the canonical submission, to tell a replay from a different payload.
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")
    rerun_of = models.UUIDField(null=True, blank=True)
    # Attempts started so far; the next start makes attempt number attempts + 1.
    attempts = models.PositiveSmallIntegerField(default=0)
    # {maxAttempts, minBackoffMs, maxBackoffMs, retryOn, retryInterrupted} (docs/retries.md);
    # null: one attempt.
    retry_policy = JSONField(null=True, blank=True)
    # The recurring schedule that made this call, and which of its occurrences it is
    # (docs/schedules.md). No foreign key: deleting a schedule leaves its calls as they are.
    schedule_id = models.UUIDField(null=True, blank=True)
    occurrence_at = models.DateTimeField(null=True, blank=True)
    # A schedule's call: its overlap policy, copied from the schedule when made ("" on other
    # calls), and what the policy did to it: "" nothing, `buffered` it waited (or waits) for the
    # schedule's previous call, `skipped` it never ran for that call, `superseded` a later
    # occurrence cancelled it (cancelOther) after it had tried.
    overlap = models.CharField(max_length=12, blank=True, default="", db_default="")
    overlap_state = models.CharField(max_length=12, blank=True, default="", db_default="")
    # Flow control (docs/flow-control.md): the host the request goes to, as limits name it
    # (orchestration.flow.target_host; null on rows older than flow control), and, while a
    # due call waits for room under its tenant's limits, since when and in which queue (its
    # host's when that host has a limit of its own, else "": the tenant's).
    target_host = models.CharField(max_length=300, null=True, blank=True)
    held_since = models.DateTimeField(null=True, blank=True)
    held_queue = models.CharField(max_length=300, blank=True, default="")
    # Milliseconds this call waited for flow control, over all its attempts.
    held_ms = models.BigIntegerField(default=0)

    class Meta:
        db_table = "service_calls"
        ordering = ["-service_call_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "service_call_id"], name="service_calls_tenant_call"),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="service_calls_tenant_idempotency_key",
            ),
            models.CheckConstraint(
                condition=Q(status__in=["Scheduled", "Running", "Succeeded", "Failed", "Cancelled"]),
                name="service_calls_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(error_kind__isnull=True) | Q(error_kind__in=ErrorKind.values),
                name="service_calls_error_kind_valid",
            ),
            # One live call per occurrence of a schedule, however many clusters make it; a
            # cancelled one (a pause, a change) leaves the occurrence free to be made again.
            models.UniqueConstraint(
                fields=["tenant", "schedule_id", "occurrence_at"],
                condition=Q(schedule_id__isnull=False) & ~Q(status="Cancelled"),
                name="service_calls_schedule_occurrence",
            ),
            models.CheckConstraint(
                condition=Q(schedule_id__isnull=True, occurrence_at__isnull=True)
                | Q(schedule_id__isnull=False, occurrence_at__isnull=False),
                name="service_calls_occurrence_with_schedule",
            ),
            # The timestamps follow the status: nothing started while Scheduled, a terminal
            # call has finished, and only a Failed call carries an error kind.
            models.CheckConstraint(
                condition=~Q(status="Scheduled") | Q(started_at__isnull=True, finished_at__isnull=True),
                name="service_calls_scheduled_not_started",
            ),
            models.CheckConstraint(
                condition=Q(status__in=["Scheduled", "Running"]) | Q(finished_at__isnull=False),
                name="service_calls_terminal_finished",
            ),
            models.CheckConstraint(
                condition=Q(status="Failed") | Q(error_kind__isnull=True),
                name="service_calls_error_kind_only_failed",
            ),
            models.CheckConstraint(
                condition=Q(overlap__in=["", *OVERLAP_POLICIES])
                & Q(overlap_state__in=OverlapState.values)
                & (~Q(overlap_state__in=[OverlapState.SKIPPED, OverlapState.SUPERSEDED]) | Q(status="Cancelled")),
                name="service_calls_overlap_valid",
            ),
            # Only a Scheduled call waits for flow control.
            models.CheckConstraint(
                condition=Q(status="Scheduled") | Q(held_since__isnull=True),
                name="service_calls_held_only_scheduled",
            ),
        ]
        indexes = [
            # Status filter of the list: WHERE tenant_id=? AND status IN (...) ORDER BY id DESC.
            models.Index(fields=["tenant", "status", "-service_call_id"], name="service_calls_tenant_status"),
            # dueFrom/dueTo filters of the list.
            models.Index(fields=["tenant", "due_at"], name="service_calls_tenant_due"),
            # Watchdog and crash recovery: Running calls by start time.
            models.Index(fields=["started_at"], condition=Q(status="Running"), name="service_calls_running"),
            # Scheduled calls that flow control does not hold, by due time: the workers' due
            # backlog (orchestration.services.service_calls_start_overdue, polled by every
            # worker process) and the watchdog's overdue sweep.
            models.Index(
                fields=["due_at"],
                condition=Q(status="Scheduled", held_since__isnull=True),
                name="service_calls_startable_due",
            ),
            # Scheduled calls that flow control does not hold, by tenant and due time: a limited
            # tenant's due calls that no start has decided yet (flow control's due order across
            # processes, orchestration.admission.held._undecided).
            models.Index(
                fields=["tenant", "due_at", "service_call_id"],
                condition=Q(status="Scheduled", held_since__isnull=True),
                name="service_calls_startable_tenant",
            ),
            # A schedule's calls that are not finished: what its overlap policy looks at when one
            # falls due, and what a finish of one releases (orchestration.services.overlap).
            models.Index(
                fields=["tenant", "schedule_id", "occurrence_at"],
                condition=Q(schedule_id__isnull=False, status__in=["Scheduled", "Running"]),
                name="service_calls_schedule_live",
            ),
            # A schedule's occurrences its overlap policy skipped, counted (its skippedCount).
            models.Index(
                fields=["tenant", "schedule_id"],
                condition=Q(overlap_state=OverlapState.SKIPPED),
                name="service_calls_overlap_skipped",
            ),
            # Flow control's held calls (orchestration.admission): the tenants that have any,
            # each tenant's queues, and the oldest calls of a queue, each an index probe.
            models.Index(
                fields=["tenant", "held_queue", "due_at", "service_call_id"],
                condition=Q(status="Scheduled", held_since__isnull=False),
                name="service_calls_held",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.service_call_id})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL


class ServiceCallTag(models.Model):
    # No index of its own: the unique (tenant, call, tag) and the tag index lead with it.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, db_column="tenant_id", related_name="+", db_index=False
    )
    service_call = models.ForeignKey(
        ServiceCall, on_delete=models.CASCADE, db_column="service_call_id", related_name="tag_rows"
    )
    tag = models.CharField(max_length=64)

    class Meta:
        db_table = "service_call_tags"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "service_call", "tag"], name="service_call_tags_unique"),
        ]
        indexes = [
            # The tag-filtered list: WHERE tenant_id=? AND tag=? ORDER BY service_call_id DESC,
            # answered from this index alone (seed: idx_service_call_tags_tag).
            models.Index(fields=["tenant", "tag", "-service_call"], name="service_call_tags_tag"),
        ]

    def __str__(self) -> str:
        return self.tag


class FlowControl(models.Model):
    """A tenant's flow-control limits and the state of its rate limits (docs/flow-control.md).

    A row exists only while the tenant has some limit; orchestration's services are its only
    writers (orchestration.admission: flow_control_set, and the start of calls, which locks the
    row while it counts and moves the TATs).
    """

    tenant = models.OneToOneField(
        "tenants.Tenant", on_delete=models.CASCADE, primary_key=True, db_column="tenant_id", related_name="+"
    )
    parallelism = models.PositiveIntegerField(null=True, blank=True)
    rate_per_second = models.FloatField(null=True, blank=True)
    # {host: {parallelism, ratePerSecond}}: the wire shape (orchestration.flow.FlowLimits).
    hosts = JSONField(default=dict, blank=True)
    # GCRA state: the theoretical arrival time of the next start (seconds since the epoch),
    # for the tenant's rate and for each host's; a TAT in the past means "may start now".
    tenant_tat = models.FloatField(null=True, blank=True)
    host_tats = JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "flow_controls"
        verbose_name = "flow control"
        verbose_name_plural = "flow controls"
        constraints = [
            models.CheckConstraint(
                condition=Q(parallelism__isnull=True) | Q(parallelism__gte=1),
                name="flow_controls_parallelism_positive",
            ),
            models.CheckConstraint(
                condition=Q(rate_per_second__isnull=True) | Q(rate_per_second__gt=0),
                name="flow_controls_rate_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"flow control of {self.tenant_id}"
