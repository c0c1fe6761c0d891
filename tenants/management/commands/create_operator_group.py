"""manage.py create_operator_group"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from core.cli import command_error
from core.errors import ApplicationError
from tenants.services import OPERATOR_GROUP, OPERATOR_PERMISSIONS, operator_group_sync


class Command(BaseCommand):
    help = (
        f"Create the '{OPERATOR_GROUP}' group, or set its permissions back to the product's list: "
        "view every admin page of the product (calls, attempts, timers, events, schedules, "
        "subscriptions, notifications, flow controls, workers, tenants, members, API keys) and the "
        "actions Run again, Cancel, Pause/Resume, Publish again, Resend/Recover, Revoke API keys "
        "and changing a subscription (turning it back on). Members who are staff see these pages "
        "for their own tenants only. Its members are left alone. Safe to run again; run it after "
        "an upgrade. See docs/operations.md."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        existed = Group.objects.filter(name=OPERATOR_GROUP).exists()
        try:
            group, added, removed = operator_group_sync()
        except ApplicationError as exc:
            raise command_error(exc) from None
        members = group.user_set.count()
        if not existed:
            self.stdout.write(f"Created group {OPERATOR_GROUP} with {len(OPERATOR_PERMISSIONS)} permissions:")
            for name in OPERATOR_PERMISSIONS:
                self.stdout.write(f"  {name}")
        elif added or removed:
            self.stdout.write(f"Updated group {OPERATOR_GROUP} ({members} member{'s' if members != 1 else ''}):")
            for name in added:
                self.stdout.write(f"  + {name}")
            for name in removed:
                self.stdout.write(f"  - {name}")
        else:
            self.stdout.write(
                f"Group {OPERATOR_GROUP} is up to date ({len(OPERATOR_PERMISSIONS)} permissions, "
                f"{members} member{'s' if members != 1 else ''}); nothing changed."
            )
