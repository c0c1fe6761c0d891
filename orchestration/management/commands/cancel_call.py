"""manage.py cancel_call: call off Scheduled calls, as the API's cancel does."""

from __future__ import annotations

import uuid

from django.core.management.base import BaseCommand, CommandError

from core.cli import command_error
from core.errors import ApplicationError
from core.ids import new_id
from orchestration.services import service_call_cancel
from tenants.cli import require_tenant


class Command(BaseCommand):
    help = (
        "Cancel Scheduled service calls of a tenant: each turns Cancelled and never starts (a call waiting "
        "for a retry too). A call already Cancelled is reported as such; a Running or finished call is "
        "refused with its status (exit 1). Prints one line per call. See docs/retries.md."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id (slug).")
        parser.add_argument("service_call_ids", nargs="+", metavar="SERVICE_CALL_ID", help="Ids of the calls.")

    def handle(self, *args, **options) -> None:
        tenant_id = options["tenant"]
        require_tenant(tenant_id)
        ids = []
        for raw in options["service_call_ids"]:
            try:
                ids.append(uuid.UUID(raw))
            except ValueError:
                raise CommandError(f"{raw!r} is not a service call id (a UUID).") from None
        refused = []
        for service_call_id in ids:
            try:
                call = service_call_cancel(
                    tenant_id=tenant_id, service_call_id=service_call_id, correlation_id=f"cli-{new_id()}"
                )
            except ApplicationError as exc:
                refused.append(command_error(exc).args[0])
                continue
            self.stdout.write(f"{call.service_call_id} Cancelled")
        if refused:
            raise CommandError("\n".join(refused))
