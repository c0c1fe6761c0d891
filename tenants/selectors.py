"""Reads of the tenants module: who may act for which tenant."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet

from tenants.ceilings import BOUNDS, Ceilings, ceilings_resolve
from tenants.models import ApiKey, Tenant, TenantCeilings
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


# --- Operator ceilings (docs/flow-control.md, "Operator ceilings") -----------------------------------

# How long a process trusts its copy of the tenants' own ceilings: a change made elsewhere (the
# admin in another web process, the command) applies within this; in the process that made it,
# at once (tenants.services.tenant_ceilings_set forgets the copy). The defaults are settings,
# read on every call.
CEILINGS_CACHE_SECONDS = 1.0


class _StoredCeilings:
    """Every tenant_ceilings row (a small table: one row per tenant the operator set apart),
    re-read at most every CEILINGS_CACHE_SECONDS: the start of calls and every submission ask."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, dict[str, Any]] = {}
        self._read_at = -1e9

    def rows(self) -> dict[str, dict[str, Any]]:
        if time.monotonic() - self._read_at < CEILINGS_CACHE_SECONDS:
            return self._rows
        # The connection before the lock: the lock's holder never waits for the pool, whose
        # connections the threads waiting for the lock may hold (core/db/pool.py).
        connection.ensure_connection()
        with self._lock:
            if time.monotonic() - self._read_at >= CEILINGS_CACHE_SECONDS:
                columns = [bound.column for bound in BOUNDS]
                self._rows = {row["tenant_id"]: row for row in TenantCeilings.objects.values("tenant_id", *columns)}
                self._read_at = time.monotonic()
        return self._rows

    def forget(self) -> None:
        with self._lock:
            self._read_at = -1e9


_stored_ceilings = _StoredCeilings()


def ceilings_forget() -> None:
    """Read the tenants' ceilings again at the next ask (after a change in this process, or a test)."""
    _stored_ceilings.forget()


def ceiling_defaults() -> dict[str, Any]:
    """The default of each ceiling, by setting name (eventservice/settings.py)."""
    return {bound.setting: getattr(settings, bound.setting) for bound in BOUNDS}


def tenant_ceilings_get(*, tenant_id: str) -> Ceilings:
    """The tenant's ceilings in force: its own where the operator set one, else the defaults.
    At most CEILINGS_CACHE_SECONDS old."""
    return ceilings_resolve(stored=_stored_ceilings.rows().get(tenant_id, {}), defaults=ceiling_defaults())


def tenant_ceilings_stored(*, tenant_id: str) -> dict[str, Any]:
    """The operator's own values for the tenant, by wire name (None: the default), read now."""
    row = TenantCeilings.objects.filter(pk=tenant_id).values(*[bound.column for bound in BOUNDS]).first() or {}
    return {bound.name: row.get(bound.column) for bound in BOUNDS}


def tenants_with_call_ceilings() -> tuple[bool, frozenset[str]]:
    """(whether every tenant has a call ceiling, by default; the tenants that have one of their
    own): the tenants whose calls go through flow control even without limits of their own."""
    everyone = settings.CEILING_CALL_PARALLELISM is not None or settings.CEILING_CALL_RATE_PER_SECOND is not None
    own = frozenset(
        tenant_id
        for tenant_id, row in _stored_ceilings.rows().items()
        if row.get("call_parallelism") is not None or row.get("call_rate_per_second") is not None
    )
    return everyone, own
