"""manage.py submit_call --tenant T --name N --method M --url U [...]"""

from __future__ import annotations

import ipaddress
import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from core.cli import command_error
from core.errors import ApplicationError, ValidationFailed
from core.ids import iso_ms, new_id, utcnow
from execution.egress import EgressPolicy, client_path
from orchestration.cli import add_request_arguments, request_spec_from_options
from orchestration.retries import MAX_ATTEMPTS, RetryOn
from orchestration.services import service_call_submit
from orchestration.validation import MAX_AHEAD, MAX_TIMEOUT_MS, past_due_warning, validate_submission
from tenants.cli import require_tenant

# Wire field names (as validation reports them) -> the option a user of this command typed.
OPTION_OF_FIELD = {
    "name": "--name",
    "requestSpec": "--method/--url",
    "requestSpec.method": "--method",
    "requestSpec.url": "--url",
    "requestSpec.headers": "--header",
    "requestSpec.body": "--body",
    "requestSpec.timeoutMs": "--timeout-ms",
    "dueAt": "--due/--in",
    "tags": "--tag",
    "idempotencyKey": "--idempotency-key",
    "retryPolicy": "--max-attempts",
    "retryPolicy.maxAttempts": "--max-attempts",
    "retryPolicy.minBackoffMs": "--min-backoff-ms",
    "retryPolicy.maxBackoffMs": "--max-backoff-ms",
    "retryPolicy.retryOn": "--retry-on",
    "retryPolicy.retryInterrupted": "--retry-interrupted",
}

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_IN = re.compile(r"^\s*(\d{1,12})\s*([smhd])\s*$")


def parse_in(value: str) -> timedelta:
    """`30s`, `5m`, `2h`, `1d` -> a timedelta; raises CommandError."""
    match = _IN.match(value)
    if match is None:
        raise CommandError(
            f"--in {value!r} is not a delay: give a whole number followed by s, m, h or d "
            "(for example 30s, 5m, 2h, 1d)."
        )
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_AHEAD.total_seconds():
        raise CommandError(f"--in {value!r} is too far ahead: a call is due at most one year ahead.")
    return timedelta(seconds=seconds)


def own_mock_target_hint(url: str) -> str | None:
    """What to do when a URL that looks like an agent's mock target is refused here.

    The egress policy allows the mock target of AGENT_BASE_URL only: the address scripts/start
    serves (it exports it for the agent, and records it in DATA_DIR/agent_base_url for the
    commands of other shells), or as set. A mock URL on another address is refused at once, as
    the workers would refuse it. Only this command gives the hint: a user of the API cannot set
    the agent's environment.
    """
    path = client_path(url=url)
    if path is None:
        return None
    base_path, under_mock, _ = path.partition("/mock/")
    if not under_mock or EgressPolicy.from_settings().literal_refusal(url) is None:
        return None
    parts = urlsplit(url)
    try:
        loopback = ipaddress.ip_address(parts.hostname or "").is_loopback
    except ValueError:
        loopback = parts.hostname == "localhost"
    if not loopback:
        return None  # an agent runs on this machine: no address elsewhere is to be allowed from here
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    other = f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{base_path}"
    return (
        f"This agent's mock target is {settings.AGENT_BASE_URL.rstrip('/')}/mock/ (AGENT_BASE_URL: the address "
        f"scripts/start serves, or as set); for an agent at {other}, export AGENT_BASE_URL={other}."
    )


def _with_hints(exc: ValidationFailed, url: str) -> ValidationFailed:
    hint = own_mock_target_hint(url) if "requestSpec.url" in exc.errors else None
    if hint is None:
        return exc
    errors = {**exc.errors, "requestSpec.url": [f"{message} {hint}" for message in exc.errors["requestSpec.url"]]}
    return ValidationFailed(errors)


class Command(BaseCommand):
    help = (
        "Submit a service call for a tenant and print its id (only the id, on stdout). "
        "It runs now, or at --due / after --in. Input is checked exactly like the REST API's; "
        "on invalid input nothing is stored and the command exits non-zero."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant id the call belongs to.")
        parser.add_argument("--name", required=True, help="A name for the call (1-200 characters).")
        add_request_arguments(
            parser,
            json_body_help="Parse --body as JSON and send it as JSON (Content-Type: application/json unless a "
            "content type header is given).",
        )
        when = parser.add_mutually_exclusive_group()
        when.add_argument(
            "--due",
            metavar="ISO",
            help="When the call is due: ISO 8601 with a time zone, e.g. 2030-01-31T09:00:00Z. "
            "Absent or past means now.",
        )
        when.add_argument("--in", dest="due_in", metavar="DELAY", help="Due after this delay: 30s, 5m, 2h or 1d.")
        parser.add_argument("--tag", action="append", default=[], help="A tag; repeat for several.")
        parser.add_argument(
            "--timeout-ms",
            type=int,
            metavar="N",
            help=f"Timeout of the attempt in milliseconds (1-{MAX_TIMEOUT_MS}; default EXECUTION_TIMEOUT_MS).",
        )
        parser.add_argument(
            "--idempotency-key",
            metavar="KEY",
            help="Submitting again with the same key and the same call prints the existing call's id; "
            "with a different call it fails.",
        )
        retries = parser.add_argument_group("retries (docs/retries.md)")
        retries.add_argument(
            "--max-attempts",
            type=int,
            metavar="N",
            help=f"Attempts in all, 1-{MAX_ATTEMPTS} (default 1: no retry). A failure named by --retry-on is "
            "tried again after a backoff doubling from --min-backoff-ms to --max-backoff-ms.",
        )
        retries.add_argument("--min-backoff-ms", type=int, metavar="MS", help="The first retry's delay (default 1000).")
        retries.add_argument(
            "--max-backoff-ms", type=int, metavar="MS", help="The longest delay, Retry-After included (default 60000)."
        )
        retries.add_argument(
            "--retry-on",
            action="append",
            metavar="KIND",
            help=f"A failure to retry; repeat for several (default all: {', '.join(RetryOn.ALL)}).",
        )
        retries.add_argument(
            "--retry-interrupted",
            action="store_true",
            help="Also retry an attempt whose worker died while it may have been sent (the target may get it twice).",
        )

    def handle(self, *args, **options: Any) -> None:
        data = self._wire_data(options)
        require_tenant(options["tenant"])
        try:
            submission = validate_submission(data)
            call, created = service_call_submit(
                tenant_id=options["tenant"], submission=submission, correlation_id=str(new_id())
            )
        except ValidationFailed as exc:
            raise command_error(_with_hints(exc, options["url"]), options=OPTION_OF_FIELD) from None
        except ApplicationError as exc:
            raise command_error(exc, options=OPTION_OF_FIELD) from None
        if not created:
            self.stderr.write("The idempotency key matched an existing call; nothing new was stored.")
        elif warning := past_due_warning(submission.due_at):
            self.stderr.write(f"Note: {warning.replace('dueAt', '--due', 1)}")
        self.stdout.write(str(call.service_call_id))

    def _wire_data(self, options: dict[str, Any]) -> dict[str, Any]:
        """The submission in the API's wire shape, so validation is the API's."""
        spec = request_spec_from_options(options)
        data: dict[str, Any] = {"name": options["name"], "requestSpec": spec}
        if options["due"] is not None:
            data["dueAt"] = options["due"]
        elif options["due_in"] is not None:
            data["dueAt"] = iso_ms(utcnow() + parse_in(options["due_in"]))
        if options["tag"]:
            data["tags"] = options["tag"]
        if options["idempotency_key"] is not None:
            data["idempotencyKey"] = options["idempotency_key"]
        policy = {
            wire: options[option]
            for option, wire in (
                ("max_attempts", "maxAttempts"),
                ("min_backoff_ms", "minBackoffMs"),
                ("max_backoff_ms", "maxBackoffMs"),
                ("retry_on", "retryOn"),
            )
            if options.get(option) is not None
        }
        if options.get("retry_interrupted"):
            policy["retryInterrupted"] = True
        if policy:
            data["retryPolicy"] = policy
        return data
