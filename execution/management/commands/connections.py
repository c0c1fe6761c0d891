"""manage.py connections <tenant> [list | show NAME | add | change NAME | delete NAME] (docs/connections.md)"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.cli import command_error
from core.errors import ApplicationError
from execution.connections import (
    connection_create,
    connection_delete,
    connection_get,
    connection_update,
    connection_wire,
    connections_list,
    validate_connection,
)
from tenants.cli import require_tenant


class Command(BaseCommand):
    help = (
        "A tenant's connections: named credentials its calls and schedules carry (docs/connections.md). "
        "`add` and `change` read the connection as the API takes it, a JSON object on standard input, so that "
        "no secret is on the command line; a secret is never printed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="The tenant id.")
        actions = parser.add_subparsers(dest="action", metavar="{list,show,add,change,delete}")
        actions.add_parser("list", help="The tenant's connections (the default).")
        for action, text in (("show", "One connection."), ("delete", "Delete one that nothing live names.")):
            actions.add_parser(action, help=text).add_argument("name")
        actions.add_parser("add", help="Make one from the JSON object on standard input.")
        change = actions.add_parser("change", help="Change one (the JSON on standard input: the fields to change).")
        change.add_argument("name")

    def handle(self, *args: Any, tenant: str, action: str | None, **options: Any) -> None:
        require_tenant(tenant)
        try:
            if action in (None, "list"):
                rows = connections_list(tenant_id=tenant)
                for row in rows:
                    self.stdout.write(f"{row.name}  {row.kind}  secret set {row.secret_updated_at.isoformat()}")
                if not rows:
                    self.stdout.write(f"{tenant} has no connections.")
                return
            name = options.get("name")
            if action == "show":
                shown = connection_wire(connection_get(tenant_id=tenant, name=name))
            elif action == "delete":
                connection_delete(tenant_id=tenant, name=name)
                self.stdout.write(f"Deleted connection {name!r}.")
                return
            elif action == "add":
                shown = connection_wire(connection_create(tenant_id=tenant, data=validate_connection(self._read())))
            else:
                existing = connection_get(tenant_id=tenant, name=name)
                data = validate_connection(self._read(), existing=existing)
                shown = connection_wire(connection_update(tenant_id=tenant, name=name, data=data))
        except ApplicationError as exc:
            raise command_error(exc) from None
        self.stdout.write(json.dumps(shown, indent=2))

    def _read(self) -> Any:
        text = sys.stdin.read()
        try:
            return json.loads(text)
        except ValueError as exc:
            raise CommandError(f"Standard input is not a JSON object: {exc}.") from None
