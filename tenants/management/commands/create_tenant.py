"""manage.py create_tenant <slug> [--name NAME]"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from core.cli import command_error
from core.errors import ApplicationError
from tenants.services import tenant_create


class Command(BaseCommand):
    help = (
        "Create a tenant. The slug is its id everywhere (API paths, events, logs): 2-63 "
        "characters, lowercase letters, digits and '-', starting with a letter or digit."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("slug", help="The tenant id, for example 'acme' or 'team-7'.")
        parser.add_argument("--name", default="", help="A display name (default: the slug).")

    def handle(self, *args, slug: str, name: str, **options) -> None:
        try:
            tenant = tenant_create(slug=slug, name=name)
        except ApplicationError as exc:
            raise command_error(exc, options={"tenant": "slug", "name": "--name"}) from None
        self.stdout.write(f"Created tenant {tenant.id} ({tenant.name}).")
