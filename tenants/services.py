"""Writes of the tenants module: tenants, memberships, API keys."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction

from core.errors import NotFound, ValidationFailed
from tenants.models import ApiKey, Membership, Tenant, tenant_slug_validator

KEY_PREFIX = "sa_"


def hash_api_key(raw_key: str) -> str:
    # Keys carry 256 bits of randomness, so a fast hash is enough (no brute force possible).
    return hashlib.sha256(raw_key.encode()).hexdigest()


def tenant_create(*, slug: str, name: str = "") -> Tenant:
    try:
        tenant_slug_validator(slug)
    except ValidationError as exc:
        raise ValidationFailed({"tenant": exc.messages}) from None
    if len(name) > 200:
        raise ValidationFailed({"name": ["A tenant name is at most 200 characters."]})
    if Tenant.objects.filter(id=slug).exists():
        raise ValidationFailed({"tenant": [f"Tenant {slug!r} already exists."]})
    return Tenant.objects.create(id=slug, name=name or slug)


def api_key_create(*, tenant_id: str, label: str = "") -> tuple[ApiKey, str]:
    """Create a key and return it with the raw key, which is never stored."""
    if not Tenant.objects.filter(id=tenant_id).exists():
        raise NotFound(f"Tenant {tenant_id!r} does not exist.")
    if len(label) > 200:
        raise ValidationFailed({"label": ["A key label is at most 200 characters."]})
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(tenant_id=tenant_id, label=label, prefix=raw[:10], key_hash=hash_api_key(raw))
    return key, raw


@transaction.atomic
def membership_add(*, username: str, tenant_id: str, role: str = Membership.Role.MEMBER) -> Membership:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"User {username!r} does not exist.")
    if not Tenant.objects.filter(id=tenant_id).exists():
        raise NotFound(f"Tenant {tenant_id!r} does not exist.")
    if role not in Membership.Role.values:
        raise ValidationFailed({"role": [f"Role must be one of {', '.join(Membership.Role.values)}."]})
    membership, _ = Membership.objects.update_or_create(tenant_id=tenant_id, user=user, defaults={"role": role})
    return membership


def api_key_revoke(*, key_ids: list[int], tenant_ids: set[str] | None = None) -> int:
    """Revoke keys (once: a revoked key keeps its first revocation time); returns how many."""
    from django.utils import timezone

    from tenants.selectors import api_key_forget

    keys = ApiKey.objects.filter(pk__in=list(key_ids), revoked_at__isnull=True)
    if tenant_ids is not None:
        keys = keys.filter(tenant_id__in=list(tenant_ids))
    hashes = list(keys.values_list("key_hash", flat=True))
    revoked = keys.update(revoked_at=timezone.now())
    for key_hash in hashes:  # refused at once here; other processes within API_KEY_CACHE_SECONDS
        api_key_forget(key_hash=key_hash)
    return revoked


# A key's last use is recorded at most this often: a write per API request would cost the hot path.
API_KEY_TOUCH_SECONDS = 60


def api_key_touch(*, api_key: ApiKey) -> None:
    """Record that `api_key` was used now (at most once a minute per key)."""
    from django.utils import timezone

    from tenants.selectors import api_key_forget

    now = timezone.now()
    if api_key.last_used_at is not None and (now - api_key.last_used_at).total_seconds() <= API_KEY_TOUCH_SECONDS:
        return
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
    api_key.last_used_at = now
    # The remembered row holds the old time: the next lookup reads the new one.
    api_key_forget(key_hash=api_key.key_hash)
