"""manage.py list_api_keys <tenant> [--json]"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand

from core.ids import iso_ms
from tenants.cli import require_tenant
from tenants.models import ApiKey


def _time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def api_key_representation(key: ApiKey) -> dict[str, Any]:
    """What may be shown of a key: never the key or its hash."""
    return {
        "id": key.pk,
        "prefix": key.prefix,
        "label": key.label,
        "createdAt": iso_ms(key.created_at),
        "lastUsedAt": iso_ms(key.last_used_at),
        "revokedAt": iso_ms(key.revoked_at),
    }


class Command(BaseCommand):
    help = (
        "List a tenant's API keys, newest first: id, the key's first characters (KEY), label, "
        "created, last used (recorded at most once a minute) and revoked. The keys themselves "
        "were shown once, when made, and are not stored (only a hash, never shown either). "
        "Revoke one with: manage.py revoke_api_key <tenant> <key or id>."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="The tenant id.")
        parser.add_argument("--json", action="store_true", help="Print a JSON array of the keys.")

    def handle(self, *args: Any, tenant: str, **options: Any) -> None:
        require_tenant(tenant)
        # Only the listed columns are read: the hash never leaves the database.
        keys = list(
            ApiKey.objects.filter(tenant_id=tenant)
            .only("pk", "prefix", "label", "created_at", "last_used_at", "revoked_at")
            .order_by("-created_at", "-pk")
        )
        if options["json"]:
            self.stdout.write(json.dumps([api_key_representation(key) for key in keys], indent=2))
            return
        if not keys:
            self.stdout.write(f"Tenant {tenant} has no API keys (make one with: manage.py create_api_key {tenant}).")
            return
        rows = [("ID", "KEY", "LABEL", "CREATED", "LAST USED", "REVOKED")]
        for key in keys:
            rows.append(
                (
                    str(key.pk),
                    f"{key.prefix}…",
                    _clip(key.label, 40) or "-",
                    _time(key.created_at),
                    _time(key.last_used_at),
                    _time(key.revoked_at),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        revoked = sum(1 for key in keys if key.revoked_at)
        noun = "key" if len(keys) == 1 else "keys"
        self.stdout.write(f"{len(keys)} {noun} ({len(keys) - revoked} live, {revoked} revoked)")
