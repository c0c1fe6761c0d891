"""manage.py rotate_secrets: re-encrypt sealed header values under the first key.

It lives at the edge: it serves four apps, re-encrypting the calls' sealed values (orchestration),
the schedules' (schedules), the webhook subscriptions' signing secrets (delivery) and the tenants'
call-signing secrets (execution), each through the app that owns the table.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from delivery.services import subscription_secrets_rotate
from execution.connections import connection_secrets_rotate
from execution.signing import signing_secrets_rotate
from orchestration.services import sealed_values_rotate
from schedules.services import schedule_sealed_values_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored secret (header values, signing secrets) under the first key of "
        "FIELD_ENCRYPTION_KEYS (values already under it are left alone). Run it after "
        "putting a new key first and before removing an old key; see docs/security.md. "
        "Exits non-zero if some value cannot be decrypted with any configured key."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--batch-size", type=int, default=500, help="Calls per transaction (default 500).")
        parser.add_argument("--dry-run", action="store_true", help="Count what would be re-encrypted; change nothing.")

    def handle(self, *args, batch_size: int, dry_run: bool, **options) -> None:
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        result = sealed_values_rotate(batch_size=batch_size, dry_run=dry_run)
        verb = "would re-encrypt" if dry_run else "re-encrypted"
        self.stdout.write(f"Examined {result.examined} calls; {verb} the secrets of {result.rotated}.")
        schedules = schedule_sealed_values_rotate(dry_run=dry_run)
        self.stdout.write(f"Examined {schedules.examined} schedules; {verb} the secrets of {schedules.rotated}.")
        hooks = subscription_secrets_rotate(dry_run=dry_run)
        self.stdout.write(
            f"Examined {hooks.examined} webhook subscriptions; {verb} the signing secrets of {hooks.rotated}."
        )
        signing = signing_secrets_rotate(dry_run=dry_run)
        self.stdout.write(
            f"Examined {signing.examined} tenants' call signing; {verb} the secrets of {signing.rotated}."
        )
        connections = connection_secrets_rotate(dry_run=dry_run)
        self.stdout.write(f"Examined {connections.examined} connections; {verb} the secrets of {connections.rotated}.")
        failed = [
            *(f"call {i}" for i in result.failed or []),
            *(f"schedule {i}" for i in schedules.failed or []),
            *(f"subscription {i}" for i in hooks.failed),
            *(f"call signing of tenant {i}" for i in signing.failed),
            *(f"connection {i}" for i in connections.failed),
        ]
        if failed:
            shown = ", ".join(failed[:10]) + (" ..." if len(failed) > 10 else "")
            raise CommandError(
                f"{len(failed)} stored secrets cannot be decrypted by any key in FIELD_ENCRYPTION_KEYS "
                f"(left unchanged): {shown}. Put the old key back in the list and run again."
            )
