"""The request a command line describes (--method, --url, --header, --body, --json-body,
--timeout-ms), shared by submit_call and create_schedule: the options, and the requestSpec they
make (not a command: Django only looks in management/commands)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from execution.egress import header_key
from orchestration.validation import MAX_BODY_DEPTH, METHODS


def add_request_arguments(parser, *, json_body_help: str = "Parse --body as JSON and send it as JSON.") -> None:
    """--method, --url, --header, --body and --json-body (each command places its --timeout-ms)."""
    parser.add_argument("--method", required=True, help=f"HTTP method: {', '.join(METHODS)}.")
    parser.add_argument("--url", required=True, help="Absolute http or https URL.")
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="A request header; repeat for several. Secret values (Authorization, *key*, "
        "*token*, ...) are encrypted at rest and never shown again.",
    )
    parser.add_argument("--body", help="The request body, sent as given (a string).")
    parser.add_argument("--json-body", action="store_true", help=json_body_help)


def parse_headers(values: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw in values:
        name, sep, value = raw.partition(":")
        if not sep or not name:
            raise CommandError(f"--header {raw!r} must look like NAME:VALUE, for example 'Accept: application/json'.")
        if any(header_key(name) == header_key(given) for given in headers):  # as receivers compare names
            raise CommandError(f"--header {name!r} is given twice.")
        headers[name] = value.lstrip(" \t")
    return headers


def request_spec_from_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options' request in the API's wire shape (`requestSpec`), for the API's validation."""
    spec: dict[str, Any] = {
        "method": options["method"],
        "url": options["url"],
        "headers": parse_headers(options["header"]),
    }
    body = options["body"]
    if options["json_body"]:
        if body is None:
            raise CommandError("--json-body needs --body.")
        try:
            body = json.loads(body)
        except ValueError as exc:
            raise CommandError(f"--body is not valid JSON: {exc}.") from None
        except RecursionError:  # deeper than the decoder goes; shallower ones meet validation's limit
            raise CommandError(f"--body is nested deeper than {MAX_BODY_DEPTH} levels.") from None
    if body is not None:
        spec["body"] = body
    if options["timeout_ms"] is not None:
        spec["timeoutMs"] = options["timeout_ms"]
    return spec
