"""manage.py create_user <username> (--password-stdin | --generate-password) [--email E] [--staff]
[--operator] [--tenant T]... [--role owner|member]"""

from __future__ import annotations

import getpass
import secrets
import sys

from django.core.management.base import BaseCommand, CommandError

from core.cli import command_error
from core.errors import ApplicationError, Conflict
from tenants.models import Membership
from tenants.services import OPERATOR_GROUP, user_create

# 24 URL-safe characters: 144 random bits.
GENERATED_PASSWORD_BYTES = 18


class Command(BaseCommand):
    help = (
        "Create a login for a teammate: a Django user with a password, optionally staff or an "
        f"operator (staff in the '{OPERATOR_GROUP}' group: the admin's pages of their tenants, "
        "see docs/operations.md) and a member of tenants. The password is read from standard "
        "input or generated (printed once); it must pass the password validators. An existing "
        "username is refused: use add_member to add someone to a tenant, changepassword to reset "
        "a password. Nothing is stored on any error."
    )
    stealth_options = ("stdin",)

    def add_arguments(self, parser) -> None:
        parser.add_argument("username", help="The login name (letters, digits and @ . + - _; at most 150).")
        password = parser.add_mutually_exclusive_group(required=True)
        password.add_argument(
            "--password-stdin",
            action="store_true",
            help="Read the password from the first line of standard input (asked twice, unseen, on a terminal).",
        )
        password.add_argument(
            "--generate-password",
            action="store_true",
            help="Generate a strong password (24 characters) and print it once.",
        )
        parser.add_argument("--email", default="", help="The user's email address.")
        parser.add_argument("--staff", action="store_true", help="May log in to the admin (with no permissions).")
        parser.add_argument(
            "--operator",
            action="store_true",
            help=f"Staff in the '{OPERATOR_GROUP}' group (created when missing): the admin's pages of "
            "their tenants. Implies --staff.",
        )
        parser.add_argument(
            "--tenant",
            action="append",
            default=[],
            metavar="TENANT",
            help="Make the user a member of this tenant; repeat for several.",
        )
        parser.add_argument(
            "--role",
            choices=Membership.Role.values,
            default=Membership.Role.MEMBER,
            help="The role in each --tenant: owner or member (default: member).",
        )

    def handle(self, *args, username: str, **options) -> None:
        if options["generate_password"]:
            password = secrets.token_urlsafe(GENERATED_PASSWORD_BYTES)
        else:
            password = self._read_password(options.get("stdin") or sys.stdin, username)
        try:
            user = user_create(
                username=username,
                password=password,
                email=options["email"],
                is_staff=options["staff"],
                operator=options["operator"],
                tenant_ids=options["tenant"],
                role=options["role"],
            )
        except Conflict as exc:
            raise CommandError(
                f"{exc.detail} Nothing was changed. Add them to a tenant with: manage.py add_member {username} "
                f"<tenant>; reset their password with: manage.py changepassword {username}."
            ) from None
        except ApplicationError as exc:
            raise command_error(
                exc, options={"email": "--email", "password": "password", "tenant": "--tenant", "role": "--role"}
            ) from None
        kind = "operator" if options["operator"] else "staff" if user.is_staff else "user"
        tenants = list(dict.fromkeys(options["tenant"]))
        where = f", {options['role']} of {', '.join(tenants)}" if tenants else ", member of no tenant"
        self.stdout.write(f"Created {kind} {user.get_username()}{where}.")
        if options["generate_password"]:
            self.stdout.write("Password (store it now; it is not shown again):")
            self.stdout.write(password)

    def _read_password(self, stdin, username: str) -> str:
        if stdin.isatty():
            first = getpass.getpass(f"Password for {username}: ")
            if getpass.getpass("Password (again): ") != first:
                raise CommandError("The passwords do not match; nothing was stored.")
            return first
        line = stdin.readline()
        password = line.rstrip("\r\n")
        if not password:
            raise CommandError("--password-stdin: standard input gave no password (an empty first line).")
        return password
