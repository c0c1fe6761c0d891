"""Reads of the tenants module: who may act for which tenant."""

from __future__ import annotations

import threading
import time
from datetime import datetime

from django.conf import settings
from django.db.models import QuerySet

from tenants.models import ApiKey, Tenant
from tenants.services import hash_api_key

# Lookups of live keys are remembered this long in each process: the lookup runs on every
# API call. A revoked key is refused at once in the process that revoked it, and in the
# others within this window (settings.API_KEY_CACHE_SECONDS, 0 turns it off).
_key_cache: dict[str, tuple[float, int, str, datetime | None]] = {}
_key_cache_lock = threading.Lock()


def api_key_forget(*, key_hash: str) -> None:
    with _key_cache_lock:
        _key_cache.pop(key_hash, None)


def api_key_lookup(*, raw_key: str) -> ApiKey | None:
    """The live key with this value (id, tenant and last use only: it runs on every API call).
    Reads only: tenants.services.api_key_touch records the use."""
    key_hash = hash_api_key(raw_key)
    ttl = settings.API_KEY_CACHE_SECONDS
    with _key_cache_lock:
        cached = _key_cache.get(key_hash)
    if cached is not None and time.monotonic() - cached[0] < ttl:
        _, pk, tenant_id, last_used_at = cached
        return ApiKey(pk=pk, tenant_id=tenant_id, key_hash=key_hash, last_used_at=last_used_at)
    row = (
        ApiKey.objects.filter(key_hash=key_hash, revoked_at__isnull=True)
        .order_by()
        .values_list("pk", "tenant_id", "last_used_at")[:1]
    )
    if not row:
        api_key_forget(key_hash=key_hash)
        return None
    pk, tenant_id, last_used_at = row[0]
    if ttl > 0:
        with _key_cache_lock:
            _key_cache[key_hash] = (time.monotonic(), pk, tenant_id, last_used_at)
    return ApiKey(pk=pk, tenant_id=tenant_id, key_hash=key_hash, last_used_at=last_used_at)


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
