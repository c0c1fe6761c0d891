"""What a subscriber receives of an event: its envelope as UTF-8 JSON, cut to fit a sink's size
limit when it is larger (docs/events.md, "Events of any size"). Pure rules, shared by every sink
(delivery/channels/: webhooks and NATS), so that no event of a call is left undeliverable by its
size, which would hold back the call's later events for the whole retry schedule."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.urls import NoReverseMatch, reverse

from core.fields import on_fresh_stack

# A webhook's body is kept within 1 MiB: the agent sets no limit of its own on a POST, but the
# receivers' proxies commonly do (nginx's client_max_body_size is 1 MiB by default), and a body
# a receiver refuses fails every try, as a NATS message over max_payload did.
WEBHOOK_MAX_BODY_BYTES = 1024 * 1024

# The most bytes one character takes in UTF-8: a body of at most limit / 4 characters fits
# without encoding it to count (nearly every body: the hot path of a claim).
_UTF8_MAX = 4


def event_body(envelope: dict[str, Any]) -> str:
    """An envelope as compact UTF-8 JSON (a webhook's POST body, signed exactly as sent; a NATS
    message's data). Not ASCII-escaped: "é" is 2 bytes, not the 6 of "\\u00e9", which made an
    envelope of accented header values three times its size. An envelope nested near the
    decoder's limit (core/fields.py) is dumped on a fresh thread's stack should the caller's be
    too deep: its claim must not fail for it."""
    body = on_fresh_stack(json.dumps, envelope, ensure_ascii=False, separators=(",", ":"))
    if not body.isascii():
        try:
            body.encode()
        except UnicodeEncodeError:
            # A lone surrogate ("\ud800" is valid JSON, not valid UTF-8): escaped, as JSON allows.
            body = on_fresh_stack(json.dumps, envelope, separators=(",", ":"))
    return body


def body_within(envelope: dict[str, Any], body: str, *, limit: int) -> str:
    """`body` (event_body(envelope)) when its UTF-8 encoding is at most `limit` bytes; else the
    envelope with its payload cut to fit, `payloadTruncated: true`, and `callUrl`, the call's
    API URL, where the whole of it can be read."""
    if len(body) * _UTF8_MAX <= limit or len(body.encode()) <= limit:
        return body
    return _cut(envelope, limit=limit)


def call_url(envelope: dict[str, Any]) -> str | None:
    """The API URL of the envelope's call (docs/api.md), built on AGENT_BASE_URL."""
    try:
        path = reverse(
            "api:service-call-detail",
            kwargs={"tenant_id": str(envelope["tenantId"]), "service_call_id": str(envelope["aggregateId"])},
        )
    except (KeyError, NoReverseMatch):  # not a call's event (a test ping), or odd ids
        return None
    return settings.AGENT_BASE_URL.rstrip("/") + path


def _cut(envelope: dict[str, Any], *, limit: int) -> str:
    """The envelope with every string of its payload clipped to the longest length that fits
    (found by halving: a dozen dumps for a rare large event), its keys and shape kept; when even
    empty strings do not fit (a payload of very many keys), its payload is the call's id alone."""
    payload = envelope.get("payload")
    marks = {"payloadTruncated": True, "callUrl": call_url(envelope)}

    def with_payload(cut: Any) -> str:
        return event_body({**envelope, "payload": cut, **marks})

    best = None
    low, high = 0, _longest_string(payload)
    while low <= high:
        length = (low + high) // 2
        body = with_payload(_clip_strings(payload, length))
        if len(body.encode()) <= limit:
            best, low = body, length + 1
        else:
            high = length - 1
    if best is not None:
        return best
    kept = (
        {"serviceCallId": payload["serviceCallId"]} if isinstance(payload, dict) and "serviceCallId" in payload else {}
    )
    return with_payload(kept)


def _longest_string(value: Any) -> int:
    longest, pending = 0, [value]
    while pending:  # iterative: a payload may nest deeper than recursion allows
        item = pending.pop()
        if isinstance(item, str):
            longest = max(longest, len(item))
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return longest


def _clip_strings(value: Any, length: int) -> Any:
    """A copy of a JSON value with every string (not keys) cut to `length` characters."""
    holder: list[Any] = [None]
    pending: list[tuple[Any, Any, Any]] = [(value, holder, 0)]
    while pending:
        item, parent, key = pending.pop()
        if isinstance(item, dict):
            copy: Any = dict.fromkeys(item)
            pending.extend((child, copy, child_key) for child_key, child in item.items())
        elif isinstance(item, list | tuple):
            copy = [None] * len(item)
            pending.extend((child, copy, index) for index, child in enumerate(item))
        elif isinstance(item, str):
            copy = item[:length]
        else:
            copy = item
        parent[key] = copy
    return holder[0]
