"""manage.py seed_demo: demo tenants, logins, an API key and calls against the mock target.

It lives at the edge: it serves several apps (tenants, memberships and keys; calls) and the
edge's mock target.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from core.cli import command_error
from core.errors import ApplicationError
from core.ids import iso_ms, new_id, utcnow
from orchestration.models import FAVORITE_TAG, ServiceCall
from orchestration.services import service_call_submit
from orchestration.validation import validate_submission
from tenants.models import ApiKey, Membership, Tenant
from tenants.services import api_key_create, membership_add, tenant_create

DEMO_TENANT = "demo"
OPS_TENANT = "demo-ops"
ADMIN_USERNAME = "admin"
KEY_LABEL = "seed_demo"
# A known login for a local trial: scripts/start runs this command at every start and points
# to "the demo login printed above", so it must stay printable. The account is no superuser
# and sees only the demo tenants; the superuser gets a random password.
DEMO_PASSWORD = "service-agent-demo"


@dataclass(frozen=True)
class DemoCall:
    name: str
    method: str
    path: str  # below /mock
    tags: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    timeout_ms: int | None = None
    due_in_minutes: int | None = None


# Varied outcomes once the workers run them: successes, HTTP errors, a slow call, a timeout,
# and calls still waiting for their due time.
DEMO_CALLS: dict[str, list[DemoCall]] = {
    DEMO_TENANT: [
        DemoCall(
            "Echo a new order",
            "POST",
            "/echo",
            ("billing", FAVORITE_TAG),
            {"Content-Type": "application/json"},
            {"orderId": 1042, "amount": 57.0, "currency": "EUR"},
        ),
        DemoCall("Fetch the order document", "GET", "/json", ("billing",)),
        DemoCall(
            "Create invoice (201)",
            "POST",
            "/echo/invoices?status=201",
            ("billing",),
            {"Authorization": "Bearer demo-secret-token"},
            {"invoice": "INV-2042", "lines": 2},
        ),
        DemoCall("Look up a missing customer (404)", "GET", "/status/404", ("billing",)),
        DemoCall("Nightly export hits a server error (500)", "POST", "/status/500", ("nightly",), body="export=all"),
        DemoCall("Slow report (1.5 s)", "GET", "/delay/1500", ("nightly", "reports")),
        DemoCall(
            "Report that times out (5 s delay, 1 s timeout)",
            "GET",
            "/delay/5000",
            ("nightly", "reports"),
            timeout_ms=1000,
        ),
        DemoCall(
            "Update settings",
            "PATCH",
            "/echo/settings",
            ("ops",),
            {"X-Api-Key": "demo-key-123", "Accept": "application/json"},
            {"retention": 7},
        ),
        DemoCall("Delete a draft (200 ms)", "DELETE", "/echo/drafts/7?delay=200", ("ops",)),
        DemoCall(
            "Nightly cleanup (scheduled)",
            "POST",
            "/echo/cleanup",
            ("nightly",),
            body={"olderThanDays": 30},
            due_in_minutes=2,
        ),
        DemoCall(
            "Billing sync (scheduled)",
            "PUT",
            "/echo/billing/sync",
            ("billing", "nightly"),
            body={"full": False},
            due_in_minutes=5,
        ),
        DemoCall("Quarterly report (scheduled)", "GET", "/json", ("reports",), due_in_minutes=10),
    ],
    OPS_TENANT: [
        DemoCall("Health probe", "GET", "/echo/health", ("ops",)),
        DemoCall("Restart hook (scheduled)", "POST", "/status/202", ("ops",), due_in_minutes=3),
    ],
}


# The scheduled demo calls are due this many minutes after seeding, from the soonest to the
# latest (what the output, the help and docs/commands.md say).
SCHEDULED_MINUTES = sorted(
    {call.due_in_minutes for calls in DEMO_CALLS.values() for call in calls if call.due_in_minutes is not None}
)
DUE_RANGE = f"{SCHEDULED_MINUTES[0]}-{SCHEDULED_MINUTES[-1]} minutes"


def demo_submission_data(call: DemoCall, *, base_url: str) -> dict[str, Any]:
    """A demo call in the API's wire shape."""
    spec: dict[str, Any] = {"method": call.method, "url": f"{base_url}/mock{call.path}", "headers": call.headers}
    if call.body is not None:
        spec["body"] = call.body
    if call.timeout_ms is not None:
        spec["timeoutMs"] = call.timeout_ms
    data: dict[str, Any] = {"name": call.name, "requestSpec": spec, "tags": list(call.tags)}
    if call.due_in_minutes is not None:
        data["dueAt"] = iso_ms(utcnow() + timedelta(minutes=call.due_in_minutes))
    return data


class Command(BaseCommand):
    help = (
        f"Create demo data; safe to run again. Tenants '{DEMO_TENANT}' and '{OPS_TENANT}', a demo "
        f"user (owner of {DEMO_TENANT}, member of {OPS_TENANT}), a superuser '{ADMIN_USERNAME}' if "
        f"absent, an API key for {DEMO_TENANT}, and calls against the built-in mock target at "
        f"AGENT_BASE_URL/mock/ (only for a tenant that has no calls yet; some due {DUE_RANGE} "
        "ahead). The superuser's random password and the API key are printed once, when created; "
        "the workers (manage.py qcluster) run the calls."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--username", default="demo", help="The demo user's name (default: demo).")
        parser.add_argument(
            "--password",
            help=f"The demo user's password (default: {DEMO_PASSWORD!r}, printed while it is still the "
            "password). Given on a later run, it resets the password.",
        )

    def handle(self, *args, username: str, password: str | None, **options: Any) -> None:
        user_model = get_user_model()
        if password is not None:
            try:
                validate_password(password, user=user_model(username=username))
            except ValidationError as exc:
                raise CommandError("--password: " + " ".join(exc.messages)) from None
        if username == ADMIN_USERNAME:
            raise CommandError(f"--username: {ADMIN_USERNAME!r} is the superuser; choose another name.")
        base_url = settings.AGENT_BASE_URL.rstrip("/")
        try:
            with transaction.atomic():
                for slug, name in ((DEMO_TENANT, "Demo"), (OPS_TENANT, "Demo operations")):
                    if not Tenant.objects.filter(id=slug).exists():
                        tenant_create(slug=slug, name=name)
                demo_password = self._demo_user(username, password)
                membership_add(username=username, tenant_id=DEMO_TENANT, role=Membership.Role.OWNER)
                membership_add(username=username, tenant_id=OPS_TENANT, role=Membership.Role.MEMBER)
                admin_password = self._admin()
                raw_key = self._api_key()
                submitted = {slug: self._calls(slug, base_url) for slug in DEMO_CALLS}
        except ApplicationError as exc:
            raise command_error(exc) from None
        self._report(base_url, username, demo_password, admin_password, raw_key, submitted)

    def _demo_user(self, username: str, password: str | None) -> str | None:
        """The password to print: one set now, or the default while it still works; else None."""
        user_model = get_user_model()
        user = user_model.objects.filter(username=username).first()
        if user is None:
            password = password or DEMO_PASSWORD
            user_model.objects.create_user(username=username, password=password)
            return password
        if password is not None:
            user.set_password(password)
            user.save(update_fields=["password"])
            return password
        return DEMO_PASSWORD if user.check_password(DEMO_PASSWORD) else None

    def _admin(self) -> str | None:
        user_model = get_user_model()
        if user_model.objects.filter(username=ADMIN_USERNAME).exists():
            return None
        password = secrets.token_urlsafe(12)
        user_model.objects.create_superuser(username=ADMIN_USERNAME, email="", password=password)
        return password

    def _api_key(self) -> str | None:
        if ApiKey.objects.filter(tenant_id=DEMO_TENANT, label=KEY_LABEL, revoked_at__isnull=True).exists():
            return None
        _, raw = api_key_create(tenant_id=DEMO_TENANT, label=KEY_LABEL)
        return raw

    def _calls(self, tenant_id: str, base_url: str) -> int:
        if ServiceCall.objects.filter(tenant_id=tenant_id).exists():
            return 0
        for call in DEMO_CALLS[tenant_id]:
            submission = validate_submission(demo_submission_data(call, base_url=base_url))
            service_call_submit(tenant_id=tenant_id, submission=submission, correlation_id=str(new_id()))
        return len(DEMO_CALLS[tenant_id])

    def _report(
        self,
        base_url: str,
        username: str,
        demo_password: str | None,
        admin_password: str | None,
        raw_key: str | None,
        submitted: dict[str, int],
    ) -> None:
        out = self.stdout.write
        out(self.style.SUCCESS("Demo data ready."))
        out(f"  Dashboard:    {base_url}/")
        out(f"  Admin:        {base_url}/admin/")
        out(f"  API docs:     {base_url}/api/docs/")
        out(f"  Mock target:  {base_url}/mock/")
        out("Logins:")
        shown = demo_password if demo_password else "(changed earlier; pass --password to set a new one)"
        out(f"  {username} / {shown}   owner of {DEMO_TENANT}, member of {OPS_TENANT}")
        shown = admin_password if admin_password else "(exists; unchanged; reset: manage.py changepassword admin)"
        out(f"  {ADMIN_USERNAME} / {shown}   superuser, for the admin")
        if demo_password == DEMO_PASSWORD:
            out(
                "  (the demo password is the documented default: set another with --password if others can reach this server)"
            )
        if raw_key:
            out(f"API key for tenant {DEMO_TENANT} (shown once; store it now):")
            out(f"  {raw_key}")
        else:
            out(
                f"API key for tenant {DEMO_TENANT}: created earlier (make another: manage.py create_api_key {DEMO_TENANT})"
            )
        for slug, count in submitted.items():
            if count:
                out(f"Calls: submitted {count} to {slug}.")
            else:
                out(f"Calls: {slug} already has calls; none added.")
        if any(submitted.values()):
            out(f"They run when the workers are up (manage.py qcluster); some are due in {DUE_RANGE}.")
