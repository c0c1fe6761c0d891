"""manage.py submit_calls --tenant T FILE (docs/commands.md): a batch of calls from a JSON file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.errors import ValidationFailed
from core.ids import new_id
from orchestration.many import BATCH_MAX, validate_batch
from orchestration.services import service_calls_submit_batch
from tenants.cli import require_tenant


class Command(BaseCommand):
    help = (
        f"Submit up to {BATCH_MAX} calls at once from a JSON file ('-': standard input) holding "
        '{"calls": [...]}, each item as POST .../service-calls takes one (docs/api.md, "Batches"). Each is '
        "accepted or refused on its own; the accepted ones are stored together. Prints a line per item, in "
        "order: the call's id, or why it was refused. Exits 1 when any item was refused."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id.")
        parser.add_argument("file", help='A JSON file {"calls": [...]}, or - for standard input.')

    def handle(self, *args: Any, tenant: str, file: str, **options: Any) -> None:
        require_tenant(tenant)
        try:
            text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
            data = json.loads(text)
        except OSError as exc:
            raise CommandError(f"Cannot read {file}: {exc.strerror}.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CommandError(f"{file} is not JSON: {exc}.") from None
        try:
            items = validate_batch(data)
        except ValidationFailed as exc:
            raise CommandError(f"Nothing was submitted: {exc.detail}") from None
        results = service_calls_submit_batch(tenant_id=tenant, items=items, correlation_id=f"cli-{new_id()}")
        refused = 0
        for number, result in enumerate(results, start=1):
            if result.error is not None:
                refused += 1
                problems = "; ".join(f"{name}: {' '.join(found)}" for name, found in result.error.errors.items())
                self.stdout.write(f"{number}: refused ({result.error.status}): {problems or result.error.detail}")
            else:
                earlier = "" if result.created else " (stored earlier under its idempotency key)"
                self.stdout.write(f"{number}: {result.call.service_call_id}{earlier}")
        if refused:
            raise CommandError(f"{refused} of {len(results)} calls were refused; the others were stored.")
