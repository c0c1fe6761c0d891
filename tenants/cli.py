"""The management commands' check that a tenant exists (theirs and orchestration's)."""

from __future__ import annotations

from django.core.management.base import CommandError

from tenants.models import Tenant


def require_tenant(tenant_id: str) -> None:
    if not Tenant.objects.filter(id=tenant_id).exists():
        raise CommandError(
            f"Tenant {tenant_id!r} does not exist (create it with: manage.py create_tenant {tenant_id})."
        )
