"""The attempt log: written before the request leaves, completed when it returns."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from execution.outcomes import ErrorKind

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


class HttpExecution(models.Model):
    class State(models.TextChoices):
        # The row exists and the request may be on the wire.
        SENDING = "Sending"
        FINISHED = "Finished"
        # The worker died while the request may have been sent.
        INTERRUPTED = "Interrupted"

    execution_id = models.UUIDField(primary_key=True, editable=False)
    # No index of its own: the unique (tenant, call, attempt) leads with it (core/schema.py,
    # DropForeignKeyIndex).
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, db_column="tenant_id", related_name="+", db_index=False
    )
    service_call = models.ForeignKey(
        "orchestration.ServiceCall",
        on_delete=models.CASCADE,
        db_column="service_call_id",
        related_name="+",
    )
    attempt = models.PositiveSmallIntegerField(default=1)
    state = models.CharField(max_length=16, choices=State.choices, default=State.SENDING)
    worker_id = models.CharField(max_length=64, blank=True, default="")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    request_url = models.CharField(max_length=2048)
    request_method = models.CharField(max_length=8)
    request_headers = models.JSONField(default=dict)  # secret values redacted
    request_body = models.TextField(null=True, blank=True)  # a snippet
    timeout_ms = models.PositiveIntegerField()
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_headers = models.JSONField(null=True, blank=True)
    response_body = models.TextField(null=True, blank=True)  # a snippet
    response_body_truncated = models.BooleanField(default=False)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    error_kind = models.CharField(max_length=16, choices=ErrorKind.choices, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    # The connection whose credentials the attempt carried (execution/credentials.py), by name.
    connection_name = models.CharField(max_length=64, blank=True, default="")
    # The tries before the one recorded above, within this attempt: an OAuth2 target's 401, after
    # which the token was fetched again and the request sent once more (docs/connections.md).
    earlier_tries = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "http_execution_log"
        ordering = ["started_at"]
        constraints = [
            # One attempt per call: inserting the row is the claim to send, so a second
            # worker racing for the same call fails here and never sends.
            models.UniqueConstraint(fields=["tenant", "service_call", "attempt"], name="http_execution_log_attempt"),
            models.CheckConstraint(condition=Q(request_method__in=METHODS), name="http_execution_log_method_valid"),
            models.CheckConstraint(
                condition=Q(state__in=["Sending", "Finished", "Interrupted"]),
                name="http_execution_log_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(error_kind__isnull=True) | Q(error_kind__in=ErrorKind.values),
                name="http_execution_log_error_kind_valid",
            ),
            models.CheckConstraint(
                condition=Q(state="Sending", finished_at__isnull=True)
                | (~Q(state="Sending") & Q(finished_at__isnull=False)),
                name="http_execution_log_finished_at_set",
            ),
        ]
        indexes = [
            # Crash recovery: attempts still Sending, oldest first.
            models.Index(fields=["started_at"], condition=Q(state="Sending"), name="http_execution_log_sending"),
            # Retention sweeps by age.
            models.Index(fields=["finished_at"], name="http_execution_log_finished"),
        ]
        verbose_name = "HTTP execution"

    def __str__(self) -> str:
        return f"{self.request_method} {self.request_url} ({self.state})"


class CallSigning(models.Model):
    """A tenant's signed calls (docs/api.md, "Signed calls"): while enabled, each attempt of its
    calls carries Standard Webhooks headers (core/signing.py). The secrets are sealed like secret
    headers; after a rotation the previous one signs too until previous_secret_until."""

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, primary_key=True, related_name="+")
    enabled = models.BooleanField(default=True)
    secret = models.JSONField(editable=False)
    previous_secret = models.JSONField(null=True, blank=True, editable=False)
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    secret_created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "call_signing"
        verbose_name = "call signing"
        verbose_name_plural = "call signing"

    def __str__(self) -> str:
        return f"{self.tenant_id}: {'on' if self.enabled else 'off'}"


class Connection(models.Model):
    """A tenant's named credentials (docs/connections.md): a call or schedule names one in
    `requestSpec.connection` and each attempt carries them. `config` holds what may be shown
    (a user name, a header's name, a token endpoint, a client id, ...); `secret` the one value
    that may not (a password, a header's value, a client secret), sealed like secret headers."""

    class Kind(models.TextChoices):
        BASIC = "basic"
        API_KEY_HEADER = "apiKeyHeader"
        OAUTH2_CLIENT_CREDENTIALS = "oauth2ClientCredentials"

    connection_id = models.UUIDField(primary_key=True, editable=False)
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, db_column="tenant_id", related_name="+", db_index=False
    )
    name = models.CharField(max_length=64)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    config = models.JSONField(default=dict)
    secret = models.JSONField(editable=False)
    # Raised by every change: an OAuth2 token fetched under an earlier version is not used again,
    # so a rotation takes effect for the next attempt.
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    secret_updated_at = models.DateTimeField()

    class Meta:
        db_table = "connections"
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="connections_tenant_name"),
            models.CheckConstraint(
                condition=Q(kind__in=["basic", "apiKeyHeader", "oauth2ClientCredentials"]),
                name="connections_kind_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class ConnectionToken(models.Model):
    """The OAuth2 access token an oauth2ClientCredentials connection last fetched, sealed, shared
    by every process on the database (execution/credentials.py): used until `use_until`, a
    moment before the token expires, and only under the connection's `version` it was fetched
    for."""

    connection = models.OneToOneField(Connection, on_delete=models.CASCADE, primary_key=True, related_name="+")
    version = models.PositiveIntegerField()
    token = models.JSONField()
    fetched_at = models.DateTimeField()
    use_until = models.DateTimeField()

    class Meta:
        db_table = "connection_tokens"
