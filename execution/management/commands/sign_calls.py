"""manage.py sign_calls <tenant> [--on | --off] [--rotate] (docs/commands.md)"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.cli import command_error
from core.errors import ApplicationError
from execution.signing import call_signing_get, call_signing_set
from tenants.cli import require_tenant


class Command(BaseCommand):
    help = (
        "Sign every attempt of a tenant's calls with Standard Webhooks headers (docs/api.md, 'Signed calls'), "
        "stop signing them, or rotate the secret (the previous one signs beside the new one for 24 hours). "
        "The secret is printed once, when it is made. Without options, shows whether the calls are signed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="The tenant id.")
        switch = parser.add_mutually_exclusive_group()
        switch.add_argument("--on", dest="enabled", action="store_const", const=True, help="Sign the calls.")
        switch.add_argument("--off", dest="enabled", action="store_const", const=False, help="Stop signing them.")
        parser.add_argument("--rotate", action="store_true", help="Make a new secret (signing must be on).")

    def handle(self, *args: Any, tenant: str, enabled: bool | None, rotate: bool, **options: Any) -> None:
        require_tenant(tenant)
        if enabled is None and rotate:
            enabled = call_signing_get(tenant_id=tenant).enabled
            if not enabled:
                raise CommandError("--rotate: the tenant's calls are not signed; sign them first with --on.")
        if enabled is not None:
            try:
                state, secret = call_signing_set(tenant_id=tenant, enabled=enabled, rotate=rotate)
            except ApplicationError as exc:
                raise command_error(exc, options={"rotateSecret": "--rotate"}) from None
            if secret:
                self.stdout.write(f"Signing secret (shown once, keep it now): {secret}")
        state = call_signing_get(tenant_id=tenant)
        self.stdout.write(f"Calls of {tenant}: {'signed' if state.enabled else 'not signed'}.")
        if state.enabled and state.previous_secret_until:
            self.stdout.write(f"The previous secret signs too until {state.previous_secret_until.isoformat()}.")
