"""One request as it goes on the wire: exactly what `requests` would send (its URL preparation,
header checks, body framing and URL credentials), worked out without its machinery, and what
the attempt log records of it (sent_headers, sent_body: docs/security.md §2). No socket here:
`execution.http.perform` sends it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.auth import HTTPBasicAuth
from requests.utils import check_header_validity, get_auth_from_url, to_native_string

from execution.egress import client_url, host_header


@dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    headers: dict[str, str]
    body: Any
    timeout_ms: int
    # Headers the agent sets on this request itself (X-Service-Call-Id, X-Service-Call-Attempt:
    # docs/retries.md); a caller may not give them (egress.REFUSED_HEADERS).
    agent_headers: dict[str, str] = field(default_factory=dict)
    # Why this request cannot go out at all (its signing secret cannot be unsealed): the attempt
    # fails at once with InternalError, nothing sent.
    cannot_send: str | None = None
    # The connection whose credentials the request carries (execution.credentials.Credential).
    credential: Any = None
    # Values never to be shown (a connection's credential, a token): scrubbed from what the
    # target answers, as secret header values are.
    secrets: tuple[str, ...] = ()


USER_AGENT = "ServiceAgent/1.0"


def encode_body(body: Any, headers: dict[str, str]) -> tuple[bytes | None, dict[str, str]]:
    """Strings go as they are; any other JSON value as JSON, with a content type if none."""
    if body is None:
        return None, headers
    if isinstance(body, str):
        return body.encode(), headers
    if not any(name.lower() == "content-type" for name in headers):
        headers = {**headers, "Content-Type": "application/json"}
    return json.dumps(body, separators=(",", ":")).encode(), headers


@dataclass(frozen=True)
class Wire:
    """One request as it goes on the wire."""

    method: str
    url: str  # as the client sends it (egress.client_url)
    target: str  # the request target: the URL's path ("/" when empty) and query
    headers: dict[str, str]  # in the order sent, each name spelled as its last setter did
    body: bytes | None
    chunked: bool  # a body without Content-Length (never, as the headers are made here)


def wire_request(*, request: HttpRequest) -> Wire:
    """The request as it goes on the wire: exactly what requests prepared for it before (its URL
    preparation, header checks, body framing and URL credentials), without its machinery. Its
    headers are the caller's plus those the agent adds (docs/security.md §2): User-Agent and
    Accept-Encoding: identity unless given, Content-Type for a JSON body unless given,
    Content-Length when there is a body (0 for a bodiless POST, PUT, PATCH or DELETE), Host,
    and the request's `agent_headers`. urllib3 and http.client add a header only when it is
    missing, so they add none. Raises ValueError (requests' InvalidURL, MissingSchema or
    InvalidHeader) for a request that cannot be sent."""
    body, headers = encode_body(request.body, dict(request.headers))
    method = to_native_string(request.method.upper())
    url = client_url(request.url)
    # Later keys win case-insensitively, at the first one's place, under the later one's
    # spelling (requests' CaseInsensitiveDict): a caller's own User-Agent replaces the agent's.
    wire: dict[str, tuple[str, str]] = {}
    for header in {"User-Agent": USER_AGENT, **headers, **request.agent_headers}.items():
        check_header_validity(header)
        name = to_native_string(header[0])
        wire[name.lower()] = (name, header[1])
    if not body:
        body = None  # requests sends an empty body as none
    if body is not None:
        wire["content-length"] = ("Content-Length", str(len(body)))
    elif method not in ("GET", "HEAD") and "content-length" not in wire:
        wire["content-length"] = ("Content-Length", "0")
    if "@" in url:  # credentials in the URL (refused at submission): requests sent them as Basic auth
        credentials = get_auth_from_url(url)
        if any(credentials):
            applied = HTTPBasicAuth(*credentials)(_HeaderHolder())
            wire["authorization"] = ("Authorization", applied.headers["Authorization"])
    if "accept-encoding" not in wire:
        wire["accept-encoding"] = ("Accept-Encoding", "identity")  # what http.client sends unasked
    try:
        wire["host"] = ("Host", host_header(url=url))
    except ValueError:
        raise requests.exceptions.InvalidURL("the host is not a valid name or address") from None
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Wire(
        method=method,
        url=url,
        target=target,
        headers=dict(wire.values()),
        body=body,
        chunked=body is not None and "content-length" not in wire,
    )


def wire_for(request: HttpRequest) -> Wire:
    """`wire_request(request)`, made once per request object: the attempt log's headers
    (sent_headers, written before the request leaves) and the attempt then share one Wire, so
    the body is encoded once and what is logged is what is sent by construction. An
    HttpRequest is frozen; the product never changes its dicts after building it."""
    wire = request.__dict__.get("_wire")
    if wire is None:
        wire = wire_request(request=request)
        object.__setattr__(request, "_wire", wire)
    return wire


class _HeaderHolder:
    """What requests' HTTPBasicAuth sets its header on."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}


def sent_body(*, request: HttpRequest) -> bytes | None:
    """The body `perform` sends for `request` (encoded once, with its headers: `wire_for`), for
    the attempt log; for a request that cannot be sent, its encoding all the same."""
    try:
        return wire_for(request).body
    except ValueError:
        return encode_body(request.body, dict(request.headers))[0]


def sent_headers(*, request: HttpRequest) -> dict[str, str]:
    """The headers `perform` sends for `request`, for the attempt log written before it goes
    out. For a URL that cannot be sent nothing goes out: the caller's headers are shown."""
    try:
        return dict(wire_for(request).headers)
    except ValueError:
        return encode_body(request.body, dict(request.headers))[1]
