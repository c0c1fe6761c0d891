"""Tenants, their members and their API keys."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

TENANT_SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{1,62}$"
tenant_slug_validator = RegexValidator(
    TENANT_SLUG_PATTERN, "A tenant id is 2-63 characters: lowercase letters, digits and '-'."
)


class Tenant(models.Model):
    id = models.CharField(primary_key=True, max_length=63, validators=[tenant_slug_validator])
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "tenants"
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(id__regex=TENANT_SLUG_PATTERN), name="tenants_id_slug"),
        ]

    def __str__(self) -> str:
        return self.id


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        MEMBER = "member", "Member"

    # No index of its own: the unique (tenant, user) leads with it (core/schema.py).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships", db_index=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "tenant_memberships"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="tenant_memberships_unique"),
            models.CheckConstraint(condition=models.Q(role__in=["owner", "member"]), name="tenant_memberships_role"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant_id} ({self.role})"


class ApiKey(models.Model):
    """An API key; only its SHA-256 is stored, the key itself is shown once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    label = models.CharField(max_length=200, blank=True)
    # The first characters of the key, shown in lists so a key can be recognised.
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "tenant_api_keys"
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant_id})"


class TenantCeilings(models.Model):
    """The operator's ceilings for one tenant (docs/flow-control.md, "Operator ceilings"): a
    column left null takes the default setting (tenants.ceilings.BOUNDS). No row: every
    default. Written only by tenants.services.tenant_ceilings_set (admin, manage.py
    set_tenant_ceilings); the tenant never writes it."""

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, primary_key=True, db_column="tenant_id", related_name="+"
    )
    call_parallelism = models.PositiveIntegerField(null=True, blank=True)
    call_rate_per_second = models.FloatField(null=True, blank=True)
    subscriptions = models.PositiveIntegerField(null=True, blank=True)
    test_pings_per_minute = models.PositiveIntegerField(null=True, blank=True)
    submissions_per_second = models.PositiveIntegerField(null=True, blank=True)
    max_attempts = models.PositiveSmallIntegerField(null=True, blank=True)
    min_backoff_ms = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "tenant_ceilings"
        verbose_name = "tenant ceilings"
        verbose_name_plural = "tenant ceilings"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(call_rate_per_second__isnull=True) | models.Q(call_rate_per_second__gt=0),
                name="tenant_ceilings_rate_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"ceilings of {self.tenant_id}"
