"""manage.py add_member <username> <tenant> [--role owner|member]"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.cli import command_error
from core.errors import ApplicationError
from tenants.cli import require_tenant
from tenants.models import Membership
from tenants.services import membership_add


class Command(BaseCommand):
    help = (
        "Make an existing user a member of a tenant, so they see its calls in the dashboard. "
        "Running it again for the same pair changes the role."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "username", help="An existing user (create one with: manage.py createsuperuser or the admin)."
        )
        parser.add_argument("tenant", help="The tenant id (create one with: manage.py create_tenant).")
        parser.add_argument(
            "--role",
            choices=Membership.Role.values,
            default=Membership.Role.MEMBER,
            help="owner or member (default: member).",
        )

    def handle(self, *args, username: str, tenant: str, role: str, **options) -> None:
        if not get_user_model().objects.filter(username=username).exists():
            raise CommandError(f"User {username!r} does not exist.")
        require_tenant(tenant)
        previous = (
            Membership.objects.filter(user__username=username, tenant_id=tenant).values_list("role", flat=True).first()
        )
        try:
            membership = membership_add(username=username, tenant_id=tenant, role=role)
        except ApplicationError as exc:
            raise command_error(exc) from None
        if previous is None:
            self.stdout.write(f"Added {username} to tenant {membership.tenant_id} as {membership.role}.")
        elif previous == membership.role:
            self.stdout.write(
                f"{username} is already {membership.role} of tenant {membership.tenant_id}; nothing changed."
            )
        else:
            self.stdout.write(
                f"Changed {username}'s role in tenant {membership.tenant_id} from {previous} to {membership.role}."
            )
