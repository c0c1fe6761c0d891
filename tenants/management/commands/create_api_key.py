"""manage.py create_api_key <tenant> [--label LABEL]"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from core.cli import command_error
from core.errors import ApplicationError
from tenants.services import api_key_create


class Command(BaseCommand):
    help = (
        "Create an API key for a tenant and print it. Only a hash is stored, so the key is "
        "shown this once: keep it. Use it as 'Authorization: Bearer <key>'."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="The tenant id the key acts for.")
        parser.add_argument("--label", default="", help="A note saying who or what uses the key (max 200 chars).")
        parser.add_argument("--quiet", action="store_true", help="Print only the key (for scripts).")

    def handle(self, *args, tenant: str, label: str, quiet: bool, **options) -> None:
        try:
            key, raw = api_key_create(tenant_id=tenant, label=label)
        except ApplicationError as exc:
            raise command_error(exc, options={"label": "--label"}) from None
        if quiet:
            self.stdout.write(raw)
            return
        self.stdout.write(
            f"Created API key {key.prefix}… for tenant {key.tenant_id}" + (f" ({key.label})" if key.label else "") + "."
        )
        self.stdout.write("Store it now; it is not shown again:")
        self.stdout.write(raw)
