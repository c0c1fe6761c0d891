"""manage.py list_subscriptions --tenant T [--json]"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand

from delivery.models import Subscription
from delivery.representation import subscription_representation
from delivery.selectors import SubscriptionFigures, subscription_figures, subscriptions_for_tenant
from tenants.cli import require_tenant


def _time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def _lag(figures: SubscriptionFigures) -> str:
    if figures.lag_p50_ms is None:
        return "-"
    return f"{figures.lag_p50_ms}/{figures.lag_p99_ms} ms"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class Command(BaseCommand):
    help = (
        "List a tenant's own subscriptions, oldest first, with their health and figures: open "
        "deliveries (PENDING), last success, failing since, and the delivery lag p50/p99 over the "
        "last hour (LAG). Secrets are never shown. --json prints them as the REST API does."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id.")
        parser.add_argument(
            "--json", action="store_true", help="Print a JSON array of the subscriptions as the REST API shows them."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant_id = options["tenant"]
        require_tenant(tenant_id)
        subscriptions = list(subscriptions_for_tenant(tenant_id=tenant_id).order_by("created_at", "pk"))
        figures = subscription_figures(subscription_ids=[row.subscription_id for row in subscriptions])
        if options["json"]:
            body = [subscription_representation(row, figures=figures.get(row.subscription_id)) for row in subscriptions]
            self.stdout.write(json.dumps(body, indent=2))
            return
        self._table(subscriptions, figures)

    def _table(self, subscriptions: list[Subscription], figures: dict[Any, SubscriptionFigures]) -> None:
        if not subscriptions:
            self.stdout.write("No subscriptions.")
            return
        rows = [("ID", "NAME", "KIND", "STATE", "PENDING", "LAST SUCCESS", "FAILING SINCE", "LAG", "EVENTS", "URL")]
        for row in subscriptions:
            own = figures.get(row.subscription_id, SubscriptionFigures())
            rows.append(
                (
                    str(row.subscription_id),
                    _clip(row.name, 32),
                    row.kind,
                    "enabled" if row.enabled else "disabled",
                    str(own.pending),
                    _time(row.last_success_at),
                    _time(row.failing_since),
                    _lag(own),
                    _clip(",".join(row.event_types) or "all", 40),
                    row.url or "-",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            self.stdout.write(
                (
                    "  ".join(cell.ljust(width) for cell, width in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
                ).rstrip()
            )
        for row in subscriptions:
            if not row.enabled and row.disabled_reason:
                self.stdout.write(f"{row.subscription_id} is disabled: {row.disabled_reason}")
        self.stdout.write(f"{len(subscriptions)} subscription{'s' if len(subscriptions) != 1 else ''}")
