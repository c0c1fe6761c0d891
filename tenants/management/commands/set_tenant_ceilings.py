"""manage.py set_tenant_ceilings <tenant> [--parallelism N] [--rate-per-second R] ... (docs/commands.md)"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from core.cli import command_error
from core.env import ascii_digits
from core.errors import ApplicationError
from tenants.ceilings import BOUNDS, BY_NAME, validate_ceilings
from tenants.cli import require_tenant
from tenants.selectors import ceilings_forget, tenant_ceilings_get, tenant_ceilings_stored
from tenants.services import tenant_ceilings_set

# Each ceiling's option: --parallelism, --rate-per-second, --test-pings-per-minute, ...
OPTIONS = {bound.name: "--" + "".join(f"-{c.lower()}" if c.isupper() else c for c in bound.name) for bound in BOUNDS}


def _value(raw: str) -> Any:
    """The option's text as the wire takes it: `default` is null (back to the default setting),
    a number is a number, anything else stays text for the validation to name."""
    text = raw.strip()
    if text.lower() == "default":
        return None
    for parse in (int, float):
        try:
            return parse(ascii_digits(text))
        except ValueError:
            continue
    return text


class Command(BaseCommand):
    help = (
        "Set the operator's ceilings for one tenant (docs/flow-control.md, 'Operator ceilings'): a tenant's "
        "own flow-control limits stay at or below them, and it cannot remove them. Give only the ceilings to "
        "change; 'default' puts one back to its default setting. Without options, shows the ceilings in "
        "force. A bad value changes nothing (exit 1)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="The tenant id.")
        for bound in BOUNDS:
            parser.add_argument(
                OPTIONS[bound.name],
                dest=bound.name,
                metavar="N" if bound.integer else "R",
                help=f"{bound.meaning}, {bound.range_text}, or 'default' ({bound.setting}).",
            )

    def handle(self, *args: Any, tenant: str, **options: Any) -> None:
        require_tenant(tenant)
        given = {name: _value(options[name]) for name in BY_NAME if options.get(name) is not None}
        if given:
            try:
                tenant_ceilings_set(tenant_id=tenant, changes=validate_ceilings(given))
            except ApplicationError as exc:
                raise command_error(exc, options=OPTIONS) from None
            self.stdout.write(f"Ceilings of tenant {tenant} set; in force now:")
        else:
            self.stdout.write(f"Ceilings of tenant {tenant}, in force now:")
        self._show(tenant)

    def _show(self, tenant: str) -> None:
        ceilings_forget()  # what is stored now, not this process's copy
        own = tenant_ceilings_stored(tenant_id=tenant)
        in_force = tenant_ceilings_get(tenant_id=tenant).as_wire()
        for bound in BOUNDS:
            source = "set for this tenant" if own[bound.name] is not None else f"default, {bound.setting}"
            self.stdout.write(f"  {OPTIONS[bound.name][2:]:<24} {bound.describe(in_force[bound.name]):>10}  ({source})")
