"""Validation of a submission, shared by every edge (API, pages, commands).

Field names in errors are the wire names (camelCase, dotted for nested fields), so the API
can return them as they are and a form can map them to its controls. The limits are SPEC §11's
(docs/security.md lists them); a URL whose host is an IP literal the egress policy refuses is
refused here already, with the policy's own code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.dateparse import parse_datetime

from eventservice.errors import ValidationFailed
from eventservice.ids import utcnow
from execution.egress import REFUSED_HEADERS as _EGRESS_REFUSED_HEADERS
from execution.egress import EgressPolicy, client_host, parse_ip_literal, refused_header

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
MAX_NAME = 200
MAX_URL = 2048
MAX_HEADERS = 50
MAX_HEADER_VALUE = 8192
MAX_BODY_BYTES = 256 * 1024
MAX_TAGS = 20
MAX_TAG = 64
MAX_IDEMPOTENCY_KEY = 200
MAX_HOST = 253
# An upper bound for callers that check a delay before building a date (submit_call --in);
# the exact rule is one calendar year (`one_year_after`).
MAX_AHEAD = timedelta(days=366)
MAX_TIMEOUT_MS = 120_000

# RFC 9110 token characters (\Z, not $: "$" would let a trailing newline through).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# Headers the agent controls itself, or that would let a caller smuggle requests; any
# `Proxy-*` header too (the egress policy owns the list).
REFUSED_HEADERS = set(_EGRESS_REFUSED_HEADERS) | {"proxy-connection"}
# 1-64 characters, none of them whitespace or control characters.
_TAG_RE = re.compile(r"[^\s\x00-\x1f\x7f]{1,64}\Z")
# A host name as requests sends it (after IDNA): letters, digits, '-', '_' and dots.
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?\Z")


@dataclass
class Submission:
    name: str
    method: str
    url: str
    headers: dict[str, str]
    body: Any
    timeout_ms: int
    due_at: datetime | None
    tags: list[str]
    idempotency_key: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    def fingerprint_payload(self) -> dict[str, Any]:
        """The canonical content compared when an idempotency key is reused."""
        return {
            "name": self.name,
            "requestSpec": {
                "method": self.method,
                "url": self.url,
                "headers": self.headers,
                "body": self.body,
                "timeoutMs": self.timeout_ms,
            },
            "dueAt": self.due_at.isoformat() if self.due_at else None,
            "tags": sorted(self.tags),
        }


class _Errors:
    def __init__(self) -> None:
        self.errors: dict[str, list[str]] = {}

    def add(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)


def has_surrogates(text: str) -> bool:
    """Lone UTF-16 surrogates (valid in JSON strings) cannot be stored or sent as UTF-8."""
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)


def header_name_error(name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return "Header names must be non-empty strings."
    if not _TOKEN.match(name):
        return f"Header name {name[:40]!r} is not a valid token."
    if refused_header(name) or name.lower() in REFUSED_HEADERS:
        return f"Header {name!r} is set by the agent and cannot be given."
    return None


def header_value_error(name: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"Header {name[:40]!r} must have a string value."
    if "\r" in value or "\n" in value or "\x00" in value:
        return f"Header {name[:40]!r} must not contain CR, LF or NUL."
    if any((ord(ch) < 32 and ch != "\t") or ord(ch) == 127 for ch in value):
        return f"Header {name[:40]!r} must not contain control characters."
    if any(ord(ch) > 255 for ch in value):
        return f"Header {name[:40]!r} must be ASCII or Latin-1 text."
    if len(value) > MAX_HEADER_VALUE:
        return f"Header {name[:40]!r} is longer than {MAX_HEADER_VALUE} characters."
    return None


def url_error(url: Any, *, policy: EgressPolicy | None = None) -> str | None:
    if not isinstance(url, str) or not url.strip():
        return "A URL is required."
    if len(url) > MAX_URL:
        return f"The URL is longer than {MAX_URL} characters."
    if has_surrogates(url):
        return "The URL is not valid Unicode text."
    if any(ch.isspace() for ch in url) or any(ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return "The URL must not contain whitespace or control characters."
    if "\\" in url:
        # Browsers read "\" as "/", RFC 3986 parsers do not: refused rather than guessed.
        return "The URL must not contain backslashes."
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"The URL is malformed: {exc}."
    if parts.scheme not in ("http", "https"):
        return "The URL must be absolute and use http or https."
    if not parts.hostname:
        return "The URL must name a host."
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "The URL must not carry credentials (user:password@); use a header."
    if port == 0:
        return "The URL's port must be between 1 and 65535."
    try:
        host = client_host(url)
    except ValueError as exc:
        return f"The URL's host is not valid: {exc}."
    if parse_ip_literal(host) is None:
        if len(host) > MAX_HOST or not _HOST_NAME.match(host):
            return "The URL's host is not a valid host name or IP address."
    elif (refusal := (policy or EgressPolicy.from_settings()).literal_refusal(url)) is not None:
        return f"The URL is refused by the egress policy: {refusal}."
    return None


def one_year_after(moment: datetime) -> datetime:
    """The same instant one calendar year later (29 February -> 28 February)."""
    try:
        return moment.replace(year=moment.year + 1)
    except ValueError:
        return moment.replace(year=moment.year + 1, day=28)


def parse_due_at(value: Any, *, now: datetime | None = None) -> datetime | None:
    """None for "now"; raises ValueError with a message on bad input."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError("dueAt must be an ISO 8601 string with a time zone.")
    text = value.strip()
    if len(text) > 64:
        raise ValueError("dueAt is not a valid ISO 8601 date-time.")
    try:
        parsed = parse_datetime(text[:-1] + "Z" if text.endswith("z") else text)
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValueError("dueAt is not a valid ISO 8601 date-time (for example 2030-01-31T09:30:00Z).")
    if parsed.tzinfo is None:
        raise ValueError("dueAt must carry a time zone (for example 'Z' or '+02:00').")
    try:
        parsed = parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError("dueAt must be at most one year ahead.") from None
    if parsed > one_year_after(now or utcnow()):
        raise ValueError("dueAt must be at most one year ahead.")
    return parsed


def clean_tags(raw: Any, errors: _Errors, field_name: str = "tags") -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors.add(field_name, "Tags must be a list of strings.")
        return []
    tags: list[str] = []
    for tag in raw:
        if not isinstance(tag, str) or not _TAG_RE.match(tag) or has_surrogates(tag):
            errors.add(field_name, f"Tag {str(tag)[:40]!r} must be 1-{MAX_TAG} characters without whitespace.")
            continue
        if tag not in tags:
            tags.append(tag)
    if len(tags) > MAX_TAGS:
        errors.add(field_name, f"At most {MAX_TAGS} tags are allowed.")
    return tags


def validate_tags(raw: Any) -> list[str]:
    """The whole new tag set of a call (PUT tags): a list is required, null is not "none"."""
    errors = _Errors()
    if not isinstance(raw, list):
        raise ValidationFailed({"tags": ["Tags must be a list of strings."]})
    tags = clean_tags(raw, errors)
    if errors.errors:
        raise ValidationFailed(errors.errors)
    return tags


def body_size(body: Any) -> int:
    """The body's size on the wire; raises ValueError if it is not a string or JSON value."""
    if body is None:
        return 0
    if isinstance(body, str):
        if has_surrogates(body):
            raise ValueError("The body is not valid Unicode text.")
        return len(body.encode())
    try:
        return len(json.dumps(body, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError):
        raise ValueError("The body must be a string or a JSON value.") from None


def validate_submission(data: Any, *, idempotency_header: str | None = None) -> Submission:
    """Check a submission in the wire shape and return it cleaned, or raise ValidationFailed."""
    errors = _Errors()
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["The request body must be a JSON object."]})

    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        errors.add("name", "A name is required.")
        name = ""
    elif len(name.strip()) > MAX_NAME:
        errors.add("name", f"The name must be at most {MAX_NAME} characters.")
    elif any(ord(ch) < 32 or ord(ch) == 127 for ch in name) or has_surrogates(name):
        errors.add("name", "The name must not contain control characters.")

    spec = data.get("requestSpec")
    method, url, headers, body, timeout_ms = "", "", {}, None, settings.EXECUTION_TIMEOUT_MS
    if not isinstance(spec, dict):
        errors.add("requestSpec", "requestSpec is required: {method, url, headers?, body?, timeoutMs?}.")
    else:
        unknown = set(spec) - {"method", "url", "headers", "body", "timeoutMs"}
        if unknown:
            errors.add("requestSpec", f"Unknown fields: {', '.join(sorted(unknown))}.")
        method = spec.get("method")
        if not isinstance(method, str) or method.upper() not in METHODS:
            errors.add("requestSpec.method", f"method must be one of {', '.join(METHODS)}.")
            method = ""
        else:
            method = method.upper()
        url = spec.get("url")
        if (message := url_error(url)) is not None:
            errors.add("requestSpec.url", message)
        raw_headers = spec.get("headers")
        if raw_headers is None:
            raw_headers = {}
        if not isinstance(raw_headers, dict):
            errors.add("requestSpec.headers", "headers must be an object of strings.")
        else:
            if len(raw_headers) > MAX_HEADERS:
                errors.add("requestSpec.headers", f"At most {MAX_HEADERS} headers are allowed.")
            seen: set[str] = set()
            for key, value in raw_headers.items():
                message = header_name_error(key) or header_value_error(key, value)
                if message is None and key.lower() in seen:
                    message = f"Header {key!r} is given twice."
                if message is not None:
                    errors.add("requestSpec.headers", message)
                    continue
                seen.add(key.lower())
                # Surrounding spaces are not part of a field value (RFC 9110 §5.5).
                headers[key] = value.strip(" \t")
        body = spec.get("body")
        # A GET body is allowed: some APIs read one; the agent sends what was asked.
        try:
            if body_size(body) > MAX_BODY_BYTES:
                errors.add("requestSpec.body", f"The body is larger than {MAX_BODY_BYTES // 1024} KiB.")
        except ValueError as exc:
            errors.add("requestSpec.body", str(exc))
        raw_timeout = spec.get("timeoutMs", settings.EXECUTION_TIMEOUT_MS)
        if isinstance(raw_timeout, bool) or not isinstance(raw_timeout, int) or not 1 <= raw_timeout <= MAX_TIMEOUT_MS:
            errors.add("requestSpec.timeoutMs", f"timeoutMs must be an integer from 1 to {MAX_TIMEOUT_MS}.")
        else:
            timeout_ms = raw_timeout

    due_at = None
    try:
        due_at = parse_due_at(data.get("dueAt"))
    except ValueError as exc:
        errors.add("dueAt", str(exc))

    tags = clean_tags(data.get("tags"), errors)

    key = data.get("idempotencyKey")
    if key is not None and idempotency_header is not None and key != idempotency_header:
        errors.add("idempotencyKey", "The body's idempotencyKey differs from the Idempotency-Key header.")
    key = key if key is not None else idempotency_header
    if key is not None:
        if not isinstance(key, str) or not key.strip() or len(key) > MAX_IDEMPOTENCY_KEY:
            errors.add("idempotencyKey", f"idempotencyKey must be 1-{MAX_IDEMPOTENCY_KEY} characters.")
        elif any(ord(ch) < 33 or ord(ch) == 127 for ch in key) or has_surrogates(key):
            errors.add("idempotencyKey", "idempotencyKey must not contain whitespace or control characters.")

    unknown_top = set(data) - {"name", "requestSpec", "dueAt", "tags", "idempotencyKey"}
    if unknown_top:
        errors.add("body", f"Unknown fields: {', '.join(sorted(unknown_top))}.")

    if errors.errors:
        raise ValidationFailed(errors.errors)
    return Submission(
        name=name.strip(),
        method=method,
        url=url,
        headers=headers,
        body=body,
        timeout_ms=timeout_ms,
        due_at=due_at,
        tags=tags,
        idempotency_key=key,
    )
