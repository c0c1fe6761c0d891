"""manage.py backfill_schedule --tenant T SCHEDULE_ID --from ISO --to ISO [--overlap POLICY]
(docs/schedules.md, "Backfill")"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from core.cli import command_error
from core.errors import ApplicationError
from core.ids import iso_ms
from orchestration.models import OVERLAP_POLICIES
from schedules.services import backfill_plan, schedule_backfill
from schedules.validation import validate_backfill
from tenants.cli import require_tenant


class Command(BaseCommand):
    help = (
        "Run a past range of a schedule's occurrences: each occurrence in [--from, --to] without its live call "
        "gets one, due now, oldest first (at most 1,000), under the schedule's overlap policy or --overlap; one that has its call keeps it, so running it again "
        "makes nothing twice. A line per occurrence: its time, the call's id, and whether it was made now."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id the schedule belongs to.")
        parser.add_argument("schedule", help="The schedule's id.")
        parser.add_argument("--from", dest="start", required=True, metavar="ISO", help="The range's first instant.")
        parser.add_argument("--to", dest="end", required=True, metavar="ISO", help="Its last (not in the future).")
        parser.add_argument(
            "--overlap",
            choices=OVERLAP_POLICIES,
            help="The overlap policy of the backfill's calls (default: the schedule's).",
        )

    def handle(
        self, *args: Any, tenant: str, schedule: str, start: str, end: str, overlap: str | None, **options: Any
    ) -> None:
        require_tenant(tenant)
        try:
            first, last, overlap = validate_backfill({"from": start, "to": end, "overlap": overlap})
            plan = backfill_plan(tenant_id=tenant, schedule_id=schedule, start=first, end=last)
            done = schedule_backfill(tenant_id=tenant, schedule_id=schedule, instants=plan, overlap=overlap)
        except ApplicationError as exc:
            raise command_error(exc, options={"from": "--from", "to": "--to"}) from None
        made = {call.pk for call in done.made}
        for call in sorted([*done.made, *done.existing], key=lambda call: call.occurrence_at):
            self.stdout.write(
                f"{iso_ms(call.occurrence_at)}  {call.pk}  {'made' if call.pk in made else 'had its call'}"
            )
        self.stderr.write(f"{len(done.made)} made, {len(done.existing)} had their call already.")
