"""Reads of the tenants module: who may act for which tenant."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from tenants.models import ApiKey, Tenant
from tenants.services import hash_api_key


def api_key_lookup(*, raw_key: str) -> ApiKey | None:
    key = (
        ApiKey.objects.select_related("tenant")
        .filter(key_hash=hash_api_key(raw_key), revoked_at__isnull=True)
        .first()
    )
    if key is not None:
        # Touch at most once a minute: a write per request would cost the hot path.
        now = timezone.now()
        if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


def tenants_for_user(*, user) -> QuerySet[Tenant]:
    if not user or not user.is_authenticated:
        return Tenant.objects.none()
    if user.is_superuser:
        return Tenant.objects.all()
    return Tenant.objects.filter(memberships__user=user).distinct()


def tenant_ids_for_user(*, user) -> set[str]:
    return set(tenants_for_user(user=user).values_list("id", flat=True))


def user_can_access_tenant(*, user, tenant_id: str) -> bool:
    if not user or not user.is_authenticated:
        return False
    if user.is_superuser:
        return Tenant.objects.filter(id=tenant_id).exists()
    return Tenant.objects.filter(id=tenant_id, memberships__user=user).exists()
