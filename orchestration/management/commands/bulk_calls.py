"""manage.py bulk_calls --tenant T --action A [filters] [--tag-value X]... [--dry-run] (docs/commands.md)"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from core.cli import command_error
from core.errors import ApplicationError
from core.ids import new_id
from orchestration.management.commands.list_calls import status_value
from orchestration.many import BULK_ACTIONS, validate_bulk
from orchestration.services import BULK_MAX, bulk_calls_matched, service_calls_bulk
from tenants.cli import require_tenant

OPTION_OF_FIELD = {
    "action": "--action",
    "tags": "--set-tag",
    "filter.status": "--status",
    "filter.tag": "--tag",
    "filter.q": "--q",
    "filter.dueFrom": "--due-from",
    "filter.dueTo": "--due-to",
    "filter.scheduleId": "--schedule",
}


class Command(BaseCommand):
    help = (
        "Cancel, run again, or add or remove tags on every call of a tenant a filter matches (the list's filters), "
        f"as POST .../service-calls/bulk does (docs/api.md, 'Bulk actions'): at most {BULK_MAX:,} calls, each the "
        "ordinary transition with its event. --dry-run counts them and changes nothing."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id.")
        parser.add_argument("--action", required=True, choices=BULK_ACTIONS, help="What to do to each call.")
        parser.add_argument("--status", action="append", default=[], type=status_value, help="Any of these statuses.")
        parser.add_argument("--tag", action="append", default=[], help="Only calls with this tag; repeat: all of them.")
        parser.add_argument("--q", default="", help="Only calls whose name contains this text (any case).")
        parser.add_argument("--due-from", default="", help="Due at or after (a date-time with a zone, or a date).")
        parser.add_argument("--due-to", default="", help="Due at or before (a date covers its day).")
        parser.add_argument("--schedule", default="", help="Only the calls this schedule made (its id).")
        parser.add_argument(
            "--set-tag", action="append", default=[], help="addTags / removeTags: the tag to add or remove; repeat."
        )
        parser.add_argument("--dry-run", action="store_true", help="Count the calls it would act on; change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant_id = options["tenant"]
        require_tenant(tenant_id)
        given = {
            "status": options["status"] or None,
            "tag": options["tag"] or None,
            "q": options["q"] or None,
            "dueFrom": options["due_from"] or None,
            "dueTo": options["due_to"] or None,
            "scheduleId": options["schedule"] or None,
        }
        data: dict[str, Any] = {
            "action": options["action"],
            "filter": {name: value for name, value in given.items() if value is not None},
            "dryRun": options["dry_run"],
        }
        if options["set_tag"]:
            data["tags"] = options["set_tag"]
        try:
            bulk = validate_bulk(data)
            result = service_calls_bulk(
                tenant_id=tenant_id,
                calls=bulk_calls_matched(tenant_id=tenant_id, bulk=bulk),
                action=bulk.action,
                tags=bulk.tags,
                dry_run=bulk.dry_run,
                correlation_id=f"cli-{new_id()}",
            )
        except ApplicationError as exc:
            raise command_error(exc, options=OPTION_OF_FIELD) from None
        calls = f"{result.matched} call{'' if result.matched == 1 else 's'}"
        if bulk.dry_run:
            self.stdout.write(f"{calls} {'matches' if result.matched == 1 else 'match'}; --dry-run: nothing changed.")
            return
        reasons = "".join(f"\n  skipped, {reason}: {count}" for reason, count in result.reasons.items())
        self.stdout.write(
            f"{calls} matched: {result.changed} changed, {result.unchanged} already so, "
            f"{result.skipped} skipped.{reasons}"
        )
