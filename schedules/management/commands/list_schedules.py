"""manage.py list_schedules --tenant T [--json]"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from core.ids import utcnow
from schedules.cron import local_iso
from schedules.models import Schedule
from schedules.representation import next_runs, schedule_representation, schedule_state
from schedules.selectors import schedules_for_tenant, skipped_of
from tenants.cli import require_tenant


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class Command(BaseCommand):
    help = (
        "List a tenant's recurring schedules, oldest first: cron and time zone, state (active, "
        "paused, ended), the next run in the schedule's zone, and the occurrences skipped while no "
        "worker ran. --json prints them as the REST API does."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id.")
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print a JSON array of the schedules as the REST API shows them (links built from AGENT_BASE_URL).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant_id = options["tenant"]
        require_tenant(tenant_id)
        schedules = list(schedules_for_tenant(tenant_id=tenant_id).order_by("schedule_id"))
        now = utcnow()
        if options["json"]:
            body = [schedule_representation(row, base_url=settings.AGENT_BASE_URL, now=now) for row in schedules]
            self.stdout.write(json.dumps(body, indent=2))
            return
        self._table(schedules, now)

    def _table(self, schedules: list[Schedule], now) -> None:
        if not schedules:
            self.stdout.write("No schedules.")
            return
        rows = [("ID", "NAME", "CRON", "TIMEZONE", "STATE", "NEXT RUN", "SKIPPED")]
        for row in schedules:
            runs = next_runs(row, now=now, count=1)
            rows.append(
                (
                    str(row.schedule_id),
                    _clip(row.name, 32),
                    row.plan_text,
                    row.timezone,
                    schedule_state(row, runs),
                    local_iso(runs[0], row.timezone) if runs else "-",
                    str(skipped_of(row)[0]),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip())
        self.stdout.write(f"{len(schedules)} schedule{'s' if len(schedules) != 1 else ''}")
