"""Subscriptions, and one notification per (event, subscription) with its own delivery state
(docs/events.md). Every try is kept as a delivery attempt."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import models
from django.db.models import Q

from core.fields import JSONField
from delivery.channels import channels, kinds


class Subscription(models.Model):
    # The kinds and their labels are the channels' (delivery/channels/): Kind.WEBHOOK == "webhook".
    Kind = models.TextChoices("Kind", [(channel.kind.upper(), (channel.kind, channel.label)) for channel in channels()])

    subscription_id = models.UUIDField(primary_key=True, editable=False)
    # Null: operator-wide (every tenant's events); set: that tenant's events only.
    # No index of its own: subscriptions_tenant_enabled leads with it (core/schema.py).
    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="subscriptions", db_index=False
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=200)
    url = models.CharField(max_length=2048, blank=True, default="")
    subject_template = models.CharField(max_length=200, blank=True, default="")
    # Empty: every event type.
    event_types = models.JSONField(default=list, blank=True)
    # Empty: the events of every call; else only those of calls carrying one of these tags
    # (docs/events.md, "Subscriptions filtered by tag").
    tags = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    # Webhook signing secrets, sealed like secret headers (core.secrets); during a rotation the
    # previous one signs too until previous_secret_until.
    secret = models.JSONField(null=True, blank=True, editable=False)
    previous_secret = models.JSONField(null=True, blank=True, editable=False)
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # Since when every try has failed (None while it delivers); its last success.
    failing_since = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        db_table = "subscriptions"
        ordering = ["created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=list(kinds())), name="subscriptions_kind_valid"),
            # Each channel's checks of its fields (a webhook has a URL).
            *(constraint for channel in channels() for constraint in channel.constraints),
        ]
        indexes = [
            # The fan-out: a tenant's (and the operator-wide) enabled subscriptions.
            models.Index(fields=["tenant", "enabled"], name="subscriptions_tenant_enabled"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


# Open notifications (PENDING or FAILED) are exactly those with a next try: the partial indexes
# below say `next_attempt_at IS NOT NULL`, which SQLite sees implied by the loop's
# `next_attempt_at <= ?` (a state IN list bound as parameters would not let it use them).
_OPEN = Q(next_attempt_at__isnull=False)

# The next try of an open notification that waits for its subscription to be enabled: beyond
# every due time, so the claims' walk of the due index never passes over it (a subscription left
# disabled collects one for each event it matches, and every claim walked them all). Enabling
# the subscription makes them due at once, in their order (delivery/services/subscriptions.py).
PARKED = datetime(9999, 12, 31, tzinfo=UTC)


class Notification(models.Model):
    """One event for one subscription: the seed's event_notifications row."""

    class State(models.TextChoices):
        PENDING = "PENDING"
        SUCCEEDED = "SUCCEEDED"
        FAILED = "FAILED"  # will be tried again at next_attempt_at
        EXPIRED = "EXPIRED"

    notification_id = models.UUIDField(primary_key=True, editable=False)
    # No index of its own: event_notifications_sub_new (subscription, created_at) leads with it
    # (core/schema.py, DropForeignKeyIndex).
    subscription = models.ForeignKey(
        Subscription, on_delete=models.CASCADE, related_name="notifications", db_index=False
    )
    # The event, copied at fan-out so a delivery reads one row (and outlives outbox retention).
    tenant_id = models.CharField(max_length=63)
    event_id = models.UUIDField()
    # The outbox sequence of the event: delivery order per (subscription, aggregate).
    event_seq = models.BigIntegerField()
    aggregate_id = models.UUIDField()
    event_type = models.CharField(max_length=40)
    envelope = JSONField()
    event_created_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    # Tries in all; `step` is the position in the retry schedule (0 again after resend/recover).
    attempts = models.PositiveIntegerField(default=0)
    step = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # The next try was asked for by an operator (resend, test): its attempt says "manual".
    manual = models.BooleanField(default=False)
    # A delivery loop's claim (lease), as the outbox dispatcher's, and the worker session that
    # holds it (NULL: none, or a claim made outside a worker): the watchdog gives back the claims
    # of a session found dead rather than leave them to the lease (docs/events.md). Nullable so
    # that adding it is an ALTER TABLE, not a copy of the whole table under SQLite's write lock.
    locked_until = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=64, null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    @property
    def next_try_at(self) -> datetime | None:
        """When it is tried next: None for a final one, and for one that waits for its
        subscription to be enabled (PARKED)."""
        return None if self.next_attempt_at == PARKED else self.next_attempt_at

    class Meta:
        db_table = "event_notifications"
        ordering = ["event_seq"]
        constraints = [
            models.UniqueConstraint(fields=["event_id", "subscription"], name="event_notifications_event_subscription"),
            models.CheckConstraint(
                condition=Q(state__in=["PENDING", "SUCCEEDED", "FAILED", "EXPIRED"]),
                name="event_notifications_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(state__in=["PENDING", "FAILED"], next_attempt_at__isnull=False)
                | Q(state__in=["SUCCEEDED", "EXPIRED"], next_attempt_at__isnull=True),
                name="event_notifications_open_has_next_try",
            ),
        ]
        indexes = [
            # The delivery loop: due notifications in the claim's order (delivery.services.
            # notifications_claim), so it walks the index and stops at its limit instead of
            # sorting every due notification by event_seq at each claim.
            models.Index(
                fields=["next_attempt_at", "event_seq"],
                condition=_OPEN,
                name="event_notifications_due_seq",
            ),
            # Order per (subscription, call): the earliest open notification of each pair.
            models.Index(
                fields=["subscription", "aggregate_id", "event_seq"],
                condition=_OPEN,
                name="event_notifications_open",
            ),
            # The watchdog: the claims held now, by session (what the delivery loops have claimed
            # and not recorded: up to DELIVERY_CLAIM_AHEAD × DELIVERY_CONCURRENCY per worker
            # process), and claims whose lease ended before anyone claimed them again.
            models.Index(
                fields=["claimed_by"],
                condition=Q(locked_until__isnull=False),
                name="event_notifications_claimed",
            ),
            # A call's events with their deliveries (API detail, details page).
            models.Index(fields=["tenant_id", "aggregate_id"], name="event_notifications_call"),
            # A subscription's deliveries, newest first (API, dashboard), and its figures.
            models.Index(fields=["subscription", "-created_at"], name="event_notifications_sub_new"),
            # A subscription's delivery lag over the last hour (delivery.selectors, /metrics).
            models.Index(
                fields=["subscription", "delivered_at"],
                condition=Q(state="SUCCEEDED"),
                name="event_notifications_delivered",
            ),
            # /metrics: EXPIRED notifications per kind (delivery.selectors.expired_counts); they
            # are few, and the table is not, so a count never scans it.
            models.Index(fields=["subscription"], condition=Q(state="EXPIRED"), name="event_notifications_expired"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} → {self.subscription_id} ({self.state})"


class DeliveryAttempt(models.Model):
    class Trigger(models.TextChoices):
        SCHEDULED = "scheduled"
        MANUAL = "manual"

    # No index of its own: the unique (notification, n) leads with it (core/schema.py,
    # DropForeignKeyIndex).
    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="delivery_attempts", db_index=False
    )
    n = models.PositiveIntegerField()
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    started_at = models.DateTimeField()
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    response_snippet = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "event_delivery_attempts"
        ordering = ["notification", "n"]
        constraints = [
            models.UniqueConstraint(fields=["notification", "n"], name="event_delivery_attempts_n"),
            models.CheckConstraint(
                condition=Q(trigger__in=["scheduled", "manual"]), name="event_delivery_attempts_trigger"
            ),
        ]
