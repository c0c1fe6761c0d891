"""manage.py list_calls --tenant T [--status S]... [--tag X]... [--limit N] [--json]"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.http import QueryDict

from core.ids import short_id
from orchestration.filters import ServiceCallFilter, filter_errors
from orchestration.models import ServiceCall
from orchestration.representation import service_call_representation
from orchestration.selectors import service_calls_for_tenant, tags_of
from tenants.cli import require_tenant

DEFAULT_LIMIT = 25
MAX_LIMIT = 200  # the API's page limit
OPTION_OF_FIELD = {"status": "--status", "tag": "--tag", "q": "--q", "favorite": "--favorite"}


def status_value(raw: str) -> str:
    """A status in any letter case -> its canonical value."""
    for value in ServiceCall.Status.values:
        if raw.lower() == value.lower():
            return value
    raise argparse.ArgumentTypeError(f"unknown status {raw!r}; choose from {', '.join(ServiceCall.Status.values)}")


def limit_value(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"the limit must be a whole number from 1 to {MAX_LIMIT}")
    return value


def _time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else ""


def _result(call: ServiceCall) -> str:
    meta = call.outcome_meta or {}
    if "responseMeta" in meta:
        response = meta["responseMeta"]
        return f"{response.get('status')} in {response.get('latencyMs')} ms"
    if "errorMeta" in meta:
        error = meta["errorMeta"]
        return f"{error.get('kind')} {error['status']}" if error.get("status") else str(error.get("kind"))
    return ""


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class Command(BaseCommand):
    help = (
        "List a tenant's service calls, newest submitted first, with the same filters as the "
        "API. ID is the last 8 hex digits of each id (use --json for whole ids and every field)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id.")
        parser.add_argument(
            "--status",
            action="append",
            default=[],
            type=status_value,
            help=f"Only calls in this status ({', '.join(ServiceCall.Status.values)}); repeat for any of several.",
        )
        parser.add_argument(
            "--tag", action="append", default=[], help="Only calls with this tag; repeat: all must match."
        )
        parser.add_argument("--q", default="", help="Only calls whose name contains this text (any case).")
        parser.add_argument("--favorite", action="store_true", help="Only starred calls.")
        parser.add_argument(
            "--limit",
            type=limit_value,
            default=DEFAULT_LIMIT,
            help=f"At most this many calls (1-{MAX_LIMIT}, default {DEFAULT_LIMIT}).",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print a JSON array of the calls as the REST API represents them (links built from AGENT_BASE_URL).",
        )

    def handle(self, *args, **options: Any) -> None:
        tenant_id = options["tenant"]
        require_tenant(tenant_id)
        data = QueryDict(mutable=True)
        data.setlist("status", options["status"])
        data.setlist("tag", options["tag"])
        if options["q"]:
            data["q"] = options["q"]
        if options["favorite"]:
            data["favorite"] = "true"
        filterset = ServiceCallFilter(data, queryset=service_calls_for_tenant(tenant_id=tenant_id), tenant_id=tenant_id)
        if not filterset.is_valid():
            lines = ["Invalid filter:"]
            for field, messages in filter_errors(filterset).items():
                lines.extend(f"  {OPTION_OF_FIELD.get(field, field)}: {message}" for message in messages)
            raise CommandError("\n".join(lines))
        calls = list(filterset.qs[: options["limit"]])
        if options["json"]:
            # The API's links are absolute, built from its request; a command has the agent's address.
            base_url = settings.AGENT_BASE_URL
            self.stdout.write(
                json.dumps([service_call_representation(call, base_url=base_url) for call in calls], indent=2)
            )
        else:
            self._table(calls, options["limit"])

    def _table(self, calls: list[ServiceCall], limit: int) -> None:
        if not calls:
            self.stdout.write("No calls match.")
            return
        rows = [("ID", "NAME", "STATUS", "SUBMITTED", "DUE / STARTED", "RESULT", "TAGS")]
        for call in calls:
            when = f"started {_time(call.started_at)}" if call.started_at else f"due {_time(call.due_at)}"
            rows.append(
                (
                    short_id(call.service_call_id),
                    _clip(call.name, 32),
                    call.status,
                    _time(call.submitted_at),
                    when,
                    _clip(_result(call), 20),
                    ",".join(tags_of(call)),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            self.stdout.write(
                (
                    "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
                ).rstrip()
            )
        more = " (the limit; use --limit for more)" if len(calls) == limit else ""
        self.stdout.write(f"{len(calls)} call{'s' if len(calls) != 1 else ''}{more}")
