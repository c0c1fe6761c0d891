"""manage.py create_subscription --tenant T --name N --url U [--event-type X]... [--disabled]"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from core.cli import command_error
from core.errors import ApplicationError
from delivery.models import Subscription
from delivery.services import subscription_create
from delivery.validation import EVENT_TYPES, MAX_NAME, validate_subscription
from tenants.cli import require_tenant

# Wire field names (as validation reports them) -> the option a user of this command typed.
OPTION_OF_FIELD = {
    "name": "--name",
    "url": "--url",
    "eventTypes": "--event-type",
    "tags": "--tag",
    "enabled": "--disabled",
}


class Command(BaseCommand):
    help = (
        "Create a webhook subscription for a tenant: its events are POSTed to --url, signed "
        "(Standard Webhooks). Prints the subscription id and its signing secret; the secret is "
        "stored sealed and shown this once: keep it. Input is checked exactly like the REST API's."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id whose events it receives.")
        parser.add_argument("--name", required=True, help=f"A name for it (1-{MAX_NAME} characters).")
        parser.add_argument(
            "--url", required=True, help="The receiver: an absolute http or https URL the egress policy allows."
        )
        parser.add_argument(
            "--event-type",
            action="append",
            default=[],
            dest="event_types",
            metavar="TYPE",
            help=f"Receive only this event type; repeat for several (default: all). One of: {', '.join(EVENT_TYPES)}.",
        )
        parser.add_argument(
            "--tag",
            action="append",
            default=[],
            dest="tags",
            help="Receive only the events of calls carrying this tag; repeat for several (any of them).",
        )
        parser.add_argument("--disabled", action="store_true", help="Create it disabled (it receives nothing).")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant_id = options["tenant"]
        require_tenant(tenant_id)
        data: dict[str, Any] = {"kind": Subscription.Kind.WEBHOOK, "name": options["name"], "url": options["url"]}
        if options["event_types"]:
            data["eventTypes"] = options["event_types"]
        if options["tags"]:
            data["tags"] = options["tags"]
        if options["disabled"]:
            data["enabled"] = False
        try:
            subscription, secret = subscription_create(tenant_id=tenant_id, data=validate_subscription(data))
        except ApplicationError as exc:
            raise command_error(exc, options=OPTION_OF_FIELD) from None
        types = ", ".join(subscription.event_types) or "all event types"
        if subscription.tags:
            types += " of calls tagged " + " or ".join(subscription.tags)
        state = "" if subscription.enabled else " (disabled)"
        self.stdout.write(
            f"Created webhook subscription {subscription.subscription_id} ({subscription.name}) for tenant "
            f"{tenant_id}{state}: {types} to {subscription.url}"
        )
        self.stdout.write("Its signing secret, shown this once (store it now):")
        self.stdout.write(secret or "")
