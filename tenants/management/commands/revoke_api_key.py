"""manage.py revoke_api_key <tenant> <key | prefix | id>"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tenants.cli import require_tenant
from tenants.models import ApiKey
from tenants.services import KEY_PREFIX, api_key_revoke, hash_api_key

# How many characters of a key are stored and listed as its prefix (tenants.services.api_key_create).
PREFIX_LENGTH = 10


def _keys_named(given: str):
    """The keys `given` names: an id, the listed prefix (with or without its '…'), or the whole key."""
    if given.isdigit():
        return ApiKey.objects.filter(pk=int(given))
    value = given.rstrip("…").rstrip(".")
    if value.startswith(KEY_PREFIX) and len(value) > PREFIX_LENGTH:
        return ApiKey.objects.filter(key_hash=hash_api_key(value))
    return ApiKey.objects.filter(prefix=value)


def _propagation() -> str:
    seconds = settings.API_KEY_CACHE_SECONDS
    if seconds == 0:
        return "Web processes refuse it from their next request (API_KEY_CACHE_SECONDS=0)."
    return (
        f"Running web processes refuse it within {seconds} s (API_KEY_CACHE_SECONDS: how long each "
        "remembers a live key)."
    )


class Command(BaseCommand):
    help = (
        "Revoke one of a tenant's API keys, named by its id or its first characters as "
        "list_api_keys shows them, or by the whole key. Requests with it are refused from then "
        "on: running web processes remember a live key for API_KEY_CACHE_SECONDS (default 5), so "
        "they refuse it within that many seconds. Revoking a revoked key changes nothing (exit 0). "
        "A key is never deleted: its row keeps when it was made, last used and revoked."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="The tenant id the key belongs to.")
        parser.add_argument(
            "key", help="The key's id, its first characters as listed (sa_xxxxxxx or sa_xxxxxxx…), or the whole key."
        )

    def handle(self, *args: Any, tenant: str, key: str, **options: Any) -> None:
        require_tenant(tenant)
        named = _keys_named(key)
        own = list(named.filter(tenant_id=tenant).order_by("pk"))
        if not own:
            if named.exclude(tenant_id=tenant).exists():
                raise CommandError(f"API key {key!r} belongs to another tenant, not {tenant}; nothing was revoked.")
            raise CommandError(
                f"Tenant {tenant} has no API key {key!r} (list them with: manage.py list_api_keys {tenant})."
            )
        if len(own) > 1:
            ids = ", ".join(str(found.pk) for found in own)
            raise CommandError(f"Several API keys of tenant {tenant} start with {key!r} (ids {ids}): give the id.")
        found = own[0]
        shown = f"API key {found.prefix}…" + (f" ({found.label})" if found.label else "") + f" of tenant {tenant}"
        if found.revoked_at is None and api_key_revoke(key_ids=[found.pk], tenant_ids={tenant}) == 1:
            self.stdout.write(f"Revoked {shown}. {_propagation()}")
            return
        found.refresh_from_db(fields=["revoked_at"])
        self.stdout.write(f"{shown} was already revoked at {found.revoked_at:%Y-%m-%d %H:%M:%SZ}; nothing changed.")
