"""Validation of a submission, shared by every edge (API, pages, commands).

Field names in errors are the wire names (camelCase, dotted for nested fields), so the API
can return them as they are and a form can map them to its controls. The limits are listed in
docs/security.md §1; a URL whose host is an IP literal the egress policy refuses is
refused here already, with the policy's own code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime

from core.errors import ValidationFailed
from core.ids import iso_ms, utcnow
from core.text import MAX_TAG, MAX_TAGS, name_problem, tag_problem  # noqa: F401 (MAX_TAG: the rule's, re-exported)
from core.text import NOT_VISIBLE as _NOT_VISIBLE
from core.text import first_of as _first_of
from execution.connections import connection_reference_error
from execution.egress import header_key
from execution.targets import header_name_error, header_value_error, url_error
from orchestration.retries import RetryPolicy, policy_errors

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
MAX_NAME = 200
MAX_HEADERS = 50
MAX_BODY_BYTES = 256 * 1024
MAX_IDEMPOTENCY_KEY = 200
# An upper bound for callers that check a delay before building a date (submit_call --in);
# the exact rule is one calendar year (`one_year_after`).
MAX_AHEAD = timedelta(days=366)
MAX_TIMEOUT_MS = 120_000
# How deep a submitted JSON value may nest (a body of objects in lists in objects...). Python's
# JSON codec recurses once per level, and so do the database's JSON columns, the renderers and
# the pages, with about 1000 levels for all of them together; 64 is far beyond any real
# payload and far below that (docs/security.md §1).
MAX_BODY_DEPTH = 64
# The whole API request document: a submission around a body of MAX_BODY_DEPTH levels, with
# room to spare so that a body just past its limit gets the precise field error, not this one.
MAX_DOCUMENT_DEPTH = 100

# 1-64 characters, none of them whitespace or control characters.


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
    retry_policy: RetryPolicy | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The tenant's connection whose credentials each attempt carries (docs/connections.md).
    connection: str | None = None

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
                **({"connection": self.connection} if self.connection else {}),
            },
            "dueAt": self.due_at.isoformat() if self.due_at else None,
            "tags": sorted(self.tags),
            **({"retryPolicy": self.retry_policy.as_wire()} if self.retry_policy else {}),
        }


class _Errors:
    def __init__(self) -> None:
        self.errors: dict[str, list[str]] = {}

    def add(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)


# A JSON string may spell "\ud800" alone, and Python decodes it to a lone surrogate: no UTF-8
# encoder (the response, the page, PostgreSQL) accepts it. PostgreSQL's text and jsonb also
# refuse NUL, which SQLite stores: refusing both keeps the two backends alike.
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# A key shown in a location as `.key`; any other key is quoted.
_PLAIN_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]{0,39}\Z")


def has_surrogates(text: str) -> bool:
    """Lone UTF-16 surrogates (valid in JSON strings) cannot be stored or sent as UTF-8."""
    return _SURROGATE.search(text) is not None


def _text_problem(text: str) -> str | None:
    match = _UNSTORABLE.search(text)
    if match is None:
        return None
    if match.group() == "\x00":
        return "contains a NUL character (U+0000), which cannot be stored"
    return f"contains a lone UTF-16 surrogate (U+{ord(match.group()):04X}): it is not valid Unicode text"


def _location(where: str, trail: tuple | None) -> str:
    """`where` followed by the keys and indexes of `trail` (a linked list, innermost first)."""
    keys: list[str | int] = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    for key in reversed(keys):
        if isinstance(key, int):
            where = f"{where}[{key}]"
        elif _PLAIN_KEY.match(key):
            where = f"{where}.{key}"
        else:
            shown = key if len(key) <= 40 else key[:40] + "…"
            where = f"{where}[{json.dumps(shown, ensure_ascii=False)}]"
    return where


def json_value_error(value: Any, *, where: str, max_depth: int = MAX_BODY_DEPTH) -> str | None:
    """Why a decoded JSON value cannot be stored or sent, or None: text anywhere in it (object
    keys included) with a NUL or a lone surrogate, or nesting deeper than `max_depth`.

    Iterative, so no input can exhaust the stack; `where` names the value in the message. The
    one check of every edge's input (docs/security.md §1).
    """
    # (value, depth, trail): the trail is only spelled out for the message, so a clean value
    # costs one tuple per node.
    pending: list[tuple[Any, int, tuple | None]] = [(value, 0, None)]
    while pending:
        item, depth, trail = pending.pop()
        if isinstance(item, str):
            if (problem := _text_problem(item)) is not None:
                return f"{_location(where, trail)} {problem}."
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                return f"{where} is nested deeper than {max_depth} levels."
            depth += 1
            if isinstance(item, dict):
                for key in item:
                    if isinstance(key, str) and (problem := _text_problem(key)) is not None:
                        return f"A key in {_location(where, trail)} {problem}."
                children = [(child, depth, (trail, key)) for key, child in item.items()]
            else:
                children = [(child, depth, (trail, index)) for index, child in enumerate(item)]
            pending.extend(reversed(children))  # popped in document order: the first problem is named
    return None


def nested_deeper_than(value: Any, max_depth: int) -> bool:
    """Whether a decoded JSON value nests more than `max_depth` levels; level by level, no
    recursion (the API parser's check of a whole request document)."""
    level, depth = [value], 0
    while True:
        containers = [item for item in level if isinstance(item, dict | list)]
        if not containers:
            return False
        depth += 1
        if depth > max_depth:
            return True
        level = []
        for item in containers:
            level.extend(item.values() if isinstance(item, dict) else item)


_TOP_FIELDS = ("name", "dueAt", "tags", "idempotencyKey", "retryPolicy")
_SPEC_FIELDS = ("method", "url", "headers", "body", "timeoutMs", "connection")


def _unstorable_fields(data: dict[str, Any], errors: _Errors) -> set[str]:
    """json_value_error over every field of a submission; returns the fields it refused, whose
    other checks are skipped (one message per field, and no check sees text it cannot read)."""
    fields = [(name, data[name]) for name in _TOP_FIELDS if name in data]
    spec = data.get("requestSpec")
    if isinstance(spec, dict):
        fields += [(f"requestSpec.{name}", spec[name]) for name in _SPEC_FIELDS if name in spec]
    refused: set[str] = set()
    for name, value in fields:
        if (message := json_value_error(value, where=name)) is not None:
            errors.add(name, message)
            refused.add(name)
    return refused


def validate_encodable(data: dict[str, Any]) -> None:
    """Refuse a submission in the wire shape only for what json_value_error finds: for a stored
    request run again, whose other fields were checked when it was submitted."""
    errors = _Errors()
    _unstorable_fields(data, errors)
    if errors.errors:
        raise ValidationFailed(errors.errors)


def _names(keys: set[str]) -> str:
    """Unknown field names for a message, with what cannot be shown replaced (U+FFFD)."""
    return ", ".join(sorted(_UNSTORABLE.sub("\ufffd", key) for key in keys))


def one_year_after(moment: datetime) -> datetime:
    """The same instant one calendar year later (29 February -> 28 February)."""
    try:
        return moment.replace(year=moment.year + 1)
    except ValueError:
        return moment.replace(year=moment.year + 1, day=28)


# A due time further back than this is worth a word: the call runs at once (docs/api.md).
PAST_DUE_NOTICE = timedelta(minutes=1)


def past_due_warning(due_at: datetime | None, *, now: datetime | None = None) -> str | None:
    """What to tell whoever gave a due time more than PAST_DUE_NOTICE in the past (it is kept:
    the call is due at once, as Cloud Tasks does), or None."""
    now = now or utcnow()
    if due_at is None or due_at >= now - PAST_DUE_NOTICE:
        return None
    return f"dueAt {iso_ms(due_at)} is in the past: the call is due now."


def parse_due_at(value: Any, *, now: datetime | None = None) -> datetime | None:
    """None for "now" (absent or null); raises ValueError with a message on bad input."""
    if value is None:
        return None
    if value == "":
        raise ValueError("dueAt is empty: give an ISO 8601 date-time, or leave it out (or null) to run now.")
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
        if (problem := tag_problem(tag)) is not None:
            errors.add(field_name, problem)
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
    if (message := json_value_error(raw, where="tags")) is not None:
        raise ValidationFailed({"tags": [message]})
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
    refused = _unstorable_fields(data, errors)
    header_problem = (
        None if idempotency_header is None else json_value_error(idempotency_header, where="Idempotency-Key")
    )
    if header_problem is not None and "idempotencyKey" not in refused:
        errors.add("idempotencyKey", header_problem)
        refused.add("idempotencyKey")

    name = data.get("name")
    if "name" in refused:
        name = ""
    elif not isinstance(name, str) or not name.strip():
        errors.add("name", "A name is required.")
        name = ""
    elif len(name.strip()) > MAX_NAME:
        errors.add("name", f"The name must be at most {MAX_NAME} characters.")
    elif (problem := name_problem(name)) is not None:
        errors.add("name", problem)

    spec = data.get("requestSpec")
    method, url, headers, body, timeout_ms = "", "", {}, None, settings.EXECUTION_TIMEOUT_MS
    connection = None
    if not isinstance(spec, dict):
        errors.add("requestSpec", "requestSpec is required: {method, url, headers?, body?, timeoutMs?, connection?}.")
    else:
        unknown = set(spec) - {"method", "url", "headers", "body", "timeoutMs", "connection"}
        if unknown:
            errors.add("requestSpec", f"Unknown fields: {_names(unknown)}.")
        method = spec.get("method")
        if "requestSpec.method" in refused:
            method = ""
        elif not isinstance(method, str) or method.upper() not in METHODS:
            errors.add("requestSpec.method", f"method must be one of {', '.join(METHODS)}.")
            method = ""
        else:
            method = method.upper()
        url = spec.get("url")
        if "requestSpec.url" not in refused and (message := url_error(url)) is not None:
            errors.add("requestSpec.url", message)
        raw_headers = spec.get("headers")
        if raw_headers is None or "requestSpec.headers" in refused:
            raw_headers = {}
        if not isinstance(raw_headers, dict):
            errors.add("requestSpec.headers", "headers must be an object of strings.")
        else:
            if len(raw_headers) > MAX_HEADERS:
                errors.add("requestSpec.headers", f"At most {MAX_HEADERS} headers are allowed.")
            seen: set[str] = set()
            for key, value in raw_headers.items():
                message = header_name_error(key) or header_value_error(key, value)
                # Compared as receivers compare them: X-A and x_a are one header to a WSGI app.
                if message is None and header_key(key) in seen:
                    message = f"Header {key!r} is given twice."
                if message is not None:
                    errors.add("requestSpec.headers", message)
                    continue
                seen.add(header_key(key))
                # Surrounding spaces are not part of a field value (RFC 9110 §5.5).
                headers[key] = value.strip(" \t")
        body = spec.get("body")
        # A GET body is allowed: some APIs read one; the agent sends what was asked.
        try:
            if "requestSpec.body" not in refused and body_size(body) > MAX_BODY_BYTES:
                errors.add("requestSpec.body", f"The body is larger than {MAX_BODY_BYTES // 1024} KiB.")
        except ValueError as exc:
            errors.add("requestSpec.body", str(exc))
        raw_timeout = spec.get("timeoutMs", settings.EXECUTION_TIMEOUT_MS)
        if isinstance(raw_timeout, bool) or not isinstance(raw_timeout, int) or not 1 <= raw_timeout <= MAX_TIMEOUT_MS:
            if "requestSpec.timeoutMs" not in refused:
                errors.add("requestSpec.timeoutMs", f"timeoutMs must be an integer from 1 to {MAX_TIMEOUT_MS}.")
        else:
            timeout_ms = raw_timeout
        connection = spec.get("connection")
        if "requestSpec.connection" not in refused and (message := connection_reference_error(connection)):
            errors.add("requestSpec.connection", message)

    due_at = None
    try:
        due_at = None if "dueAt" in refused else parse_due_at(data.get("dueAt"))
    except ValueError as exc:
        errors.add("dueAt", str(exc))

    tags = [] if "tags" in refused else clean_tags(data.get("tags"), errors)

    key = data.get("idempotencyKey")
    if key is not None and idempotency_header is not None and key != idempotency_header:
        errors.add("idempotencyKey", "The body's idempotencyKey differs from the Idempotency-Key header.")
    key = key if key is not None else idempotency_header
    if key is not None and "idempotencyKey" not in refused:
        if not isinstance(key, str) or not key.strip() or len(key) > MAX_IDEMPOTENCY_KEY:
            errors.add("idempotencyKey", f"idempotencyKey must be 1-{MAX_IDEMPOTENCY_KEY} characters.")
        elif (ch := _first_of(key, _NOT_VISIBLE)) is not None:
            errors.add(
                "idempotencyKey",
                "idempotencyKey must be visible characters only: no whitespace, control or "
                f"invisible formatting characters (U+{ord(ch):04X}).",
            )

    retry_policy = None
    if "retryPolicy" not in refused:
        retry_policy, policy_problems = policy_errors(data.get("retryPolicy"))
        for name, messages in policy_problems.items():
            for message in messages:
                errors.add(name, message)

    unknown_top = set(data) - {"name", "requestSpec", "dueAt", "tags", "idempotencyKey", "retryPolicy"}
    if unknown_top:
        errors.add("body", f"Unknown fields: {_names(unknown_top)}.")

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
        retry_policy=retry_policy,
        connection=connection,
    )


def validate_rerun(data: Any) -> datetime | None:
    """Check the body of a rerun (`{dueAt?}`, empty for now) and return its due time, or None
    for now; raise ValidationFailed otherwise. dueAt gets exactly a submission's rules and
    messages; nothing else may be given."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["The request body must be a JSON object."]})
    errors = _Errors()
    _unstorable_fields({"dueAt": data["dueAt"]} if "dueAt" in data else {}, errors)
    due_at = None
    if not errors.errors:
        try:
            due_at = parse_due_at(data.get("dueAt"))
        except ValueError as exc:
            errors.add("dueAt", str(exc))
    unknown = set(data) - {"dueAt"}
    if unknown:
        errors.add("body", f"Unknown fields: {_names(unknown)}.")
    if errors.errors:
        raise ValidationFailed(errors.errors)
    return due_at
