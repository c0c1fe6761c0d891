"""manage.py create_schedule --tenant T --name N --cron '...' --method M --url U [...]"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from core.cli import command_error
from core.errors import ApplicationError
from core.ids import iso_ms
from orchestration.cli import add_request_arguments, request_spec_from_options
from orchestration.models import OVERLAP_POLICIES
from orchestration.validation import MAX_TIMEOUT_MS
from schedules.cron import DST_REPEATED, DST_SKIPPED, local_iso
from schedules.representation import next_runs
from schedules.services import schedule_create
from schedules.validation import validate_schedule
from tenants.cli import require_tenant

# Wire field names (as validation reports them) -> the option a user of this command typed.
OPTION_OF_FIELD = {
    "name": "--name",
    "cron": "--cron",
    "every": "--every",
    "timezone": "--timezone",
    "requestSpec": "--method/--url",
    "requestSpec.method": "--method",
    "requestSpec.url": "--url",
    "requestSpec.headers": "--header",
    "requestSpec.body": "--body",
    "requestSpec.timeoutMs": "--timeout-ms",
    "tags": "--tag",
    "startAt": "--start-at",
    "endAt": "--end-at",
    "catchupWindow": "--catchup-window",
    "pausedNote": "--paused-note",
    "jitterMs": "--jitter-ms",
    "overlap": "--overlap",
}


class Command(BaseCommand):
    help = (
        "Create a recurring schedule for a tenant: every occurrence of --cron in --timezone becomes one "
        "service call with this request. Prints its id on stdout, and its next runs on stderr. Input is "
        "checked exactly like the REST API's; on invalid input nothing is stored and the command exits 1."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id the schedule belongs to.")
        parser.add_argument("--name", required=True, help="A name for the schedule and its calls (1-200 characters).")
        plan = parser.add_mutually_exclusive_group(required=True)
        plan.add_argument(
            "--cron",
            help="Five fields, minute hour day-of-month month day-of-week, e.g. '30 2 * * *' (quote it).",
        )
        plan.add_argument(
            "--every",
            metavar="DURATION",
            help="An interval instead of a cron: 90s, 15m, 6h (at least a minute), from --start-at or now.",
        )
        parser.add_argument(
            "--timezone", help="The IANA time zone the cron is read in, e.g. Europe/Berlin (default UTC)."
        )
        add_request_arguments(parser)
        parser.add_argument("--tag", action="append", default=[], help="A tag of every call; repeat for several.")
        parser.add_argument(
            "--timeout-ms",
            type=int,
            metavar="N",
            help=f"Timeout of each attempt in milliseconds (1-{MAX_TIMEOUT_MS}; default EXECUTION_TIMEOUT_MS).",
        )
        parser.add_argument(
            "--start-at", metavar="ISO", help="No occurrence before this (ISO 8601 with a zone, at most a year ahead)."
        )
        parser.add_argument("--end-at", metavar="ISO", help="No occurrence after this (ISO 8601 with a zone).")
        parser.add_argument("--paused", action="store_true", help="Create it paused: no call until it is resumed.")
        parser.add_argument("--paused-note", metavar="TEXT", help="Why it is paused (with --paused).")
        parser.add_argument(
            "--dst-skipped",
            choices=DST_SKIPPED,
            help="A local time the spring-forward jump skips: run right after the jump (default) or skip it.",
        )
        parser.add_argument(
            "--dst-repeated",
            choices=DST_REPEATED,
            help="A local time the fall-back repeats: run on its first pass (default) or on both.",
        )
        parser.add_argument(
            "--overlap",
            choices=OVERLAP_POLICIES,
            help="When an occurrence falls due while an earlier call is still going: skip it (default), "
            "bufferOne (run it when that one ends), allowAll, cancelOther (cancel the earlier calls still Scheduled).",
        )
        parser.add_argument(
            "--jitter-ms", type=int, metavar="N", help="Each occurrence's call is due up to N ms later (0-3600000)."
        )
        parser.add_argument(
            "--catchup-window",
            metavar="DURATION",
            help="Missed occurrences no older than this run once each; older ones are skipped (90s, 15m, 6h, 30d; "
            "default 1m).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        data = self._wire_data(options)
        require_tenant(options["tenant"])
        try:
            schedule = schedule_create(tenant_id=options["tenant"], data=validate_schedule(data))
        except ApplicationError as exc:
            raise command_error(exc, options=OPTION_OF_FIELD) from None
        self.stdout.write(str(schedule.schedule_id))
        runs = next_runs(schedule, count=3)
        if runs:
            shown = ", ".join(f"{local_iso(at, schedule.timezone)} ({iso_ms(at)})" for at in runs)
            self.stderr.write(f"Next runs: {shown}")
        else:
            self.stderr.write("Paused: it makes no call until it is resumed.")

    def _wire_data(self, options: dict[str, Any]) -> dict[str, Any]:
        """The schedule in the API's wire shape, so validation is the API's."""
        spec = request_spec_from_options(options)
        data: dict[str, Any] = {"name": options["name"], "requestSpec": spec}
        if options["every"] is not None:
            data["every"] = options["every"]
        else:
            data["cron"] = options["cron"]
        if options["timezone"] is not None:
            data["timezone"] = options["timezone"]
        if options["tag"]:
            data["tags"] = options["tag"]
        if options["start_at"] is not None:
            data["startAt"] = options["start_at"]
        if options["end_at"] is not None:
            data["endAt"] = options["end_at"]
        if options["paused"]:
            data["paused"] = True
        if options["paused_note"] is not None:
            data["pausedNote"] = options["paused_note"]
        if options["dst_skipped"] is not None:
            data["dstSkipped"] = options["dst_skipped"]
        if options["dst_repeated"] is not None:
            data["dstRepeated"] = options["dst_repeated"]
        if options["jitter_ms"] is not None:
            data["jitterMs"] = options["jitter_ms"]
        if options["catchup_window"] is not None:
            data["catchupWindow"] = options["catchup_window"]
        if options["overlap"] is not None:
            data["overlap"] = options["overlap"]
        return data
