"""Events appended in the same transaction as the state change they describe."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from core.fields import JSONField


class OutboxEvent(models.Model):
    class Type(models.TextChoices):
        SUBMITTED = "ServiceCallSubmitted"
        SCHEDULED = "ServiceCallScheduled"
        RUNNING = "ServiceCallRunning"
        SUCCEEDED = "ServiceCallSucceeded"
        FAILED = "ServiceCallFailed"
        TAGGED = "ServiceCallTagged"
        CANCELLED = "ServiceCallCancelled"
        RETRY_SCHEDULED = "ServiceCallRetryScheduled"
        # A schedule's occurrence that never runs (docs/schedules.md, "Missed occurrences"):
        # its aggregate is the schedule.
        OCCURRENCE_SKIPPED = "ScheduleOccurrenceSkipped"

    # Publication order is this sequence, per aggregate and overall.
    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(unique=True, editable=False)
    # No foreign key: the outbox is shared infrastructure and outlives nothing it points to
    # only by convention; events of a deleted call are swept by retention.
    tenant_id = models.CharField(max_length=63)
    aggregate_id = models.UUIDField()
    event_type = models.CharField(max_length=32, choices=Type.choices)
    event_payload = JSONField()  # the whole envelope (docs/schema.md, 'The event envelope')
    created_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # A dispatcher's claim: rows are published by one dispatcher at a time.
    locked_until = models.DateTimeField(null=True, blank=True)
    # The event's place in its tenant's pull feed: given once, when it is first marked
    # published, and kept when it is published again. Unlike `id` (taken at INSERT, committed
    # in any order) these numbers commit in order (docs/architecture.md, 'The events feed').
    feed_seq = models.BigIntegerField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "outbox"
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    event_type__in=[
                        "ServiceCallSubmitted",
                        "ServiceCallScheduled",
                        "ServiceCallRunning",
                        "ServiceCallSucceeded",
                        "ServiceCallFailed",
                        "ServiceCallTagged",
                        "ServiceCallCancelled",
                        "ServiceCallRetryScheduled",
                        "ScheduleOccurrenceSkipped",
                    ]
                ),
                name="outbox_event_type_valid",
            ),
            # The events feed: WHERE tenant_id = ? AND feed_seq > ? ORDER BY feed_seq. Unique,
            # so a feed position can never be given twice.
            models.UniqueConstraint(
                fields=["tenant_id", "feed_seq"],
                condition=Q(feed_seq__isnull=False),
                name="outbox_tenant_feed",
            ),
        ]
        indexes = [
            # The dispatcher: WHERE published_at IS NULL ORDER BY id.
            models.Index(fields=["id"], condition=Q(published_at__isnull=True), name="outbox_unpublished"),
            # A call's events on its details page and in the API.
            models.Index(fields=["tenant_id", "aggregate_id", "id"], name="outbox_tenant_aggregate"),
            # Retention of published events.
            models.Index(fields=["published_at"], name="outbox_published_at"),
        ]
        verbose_name = "outbox event"

    def __str__(self) -> str:
        return f"#{self.id} {self.event_type} {self.aggregate_id}"


class OutboxFeedCounter(models.Model):
    """The last feed number given to a tenant's events (see OutboxEvent.feed_seq).

    A row, not MAX(feed_seq) + 1: retention may delete a tenant's every published event, and
    the next numbers must still be above any iterator a reader holds. Its row lock, held until
    the marking transaction commits, is what makes feed numbers commit in order.
    """

    tenant_id = models.CharField(max_length=63, primary_key=True)
    last_seq = models.BigIntegerField(default=0)
    # Where the outbox is partitioned (PostgreSQL): every event numbered above `floor_seq` has an
    # event_id of at least `floor_key`, so a feed read past that number reads only the partitions
    # from there on (docs/architecture.md, "The events feed"). Set by the retention run.
    floor_seq = models.BigIntegerField(null=True, blank=True, editable=False)
    floor_key = models.UUIDField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "outbox_feed_counters"
        verbose_name = "outbox feed counter"

    def __str__(self) -> str:
        return f"{self.tenant_id} at {self.last_seq}"
