"""One HTTP attempt with `requests`: no redirects, no proxies, bounded in time and size.

Never call this inside a database transaction (docs/architecture.md); `perform` checks.

Nothing but connections outlives an attempt: there is no `requests.Session` (its cookie jar,
default headers and auth would carry one call's state into the next, of any tenant), only a
per-thread adapter whose pools keep connections alive. An attempt sends exactly
`wire_request`'s headers, which the attempt log records (docs/security.md §2).

Bounds (docs/security.md): one deadline for the whole attempt (resolution, connect, headers
and body: a server dripping a byte at a time cannot stretch it), at most
RESPONSE_MAX_HEADERS headers in RESPONSE_MAX_HEADER_BYTES, and at most
RESPONSE_BODY_MAX_BYTES of body read *after* decompression (urllib3 2.8 inflates
incrementally, never more than it is asked for), of which only the snippet is kept: a gzip
bomb or an endless body costs one chunk of memory and a bounded read, not its expanded size.
"""

from __future__ import annotations

import base64
import binascii
import errno
import heapq
import http.client
import itertools
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import requests
import urllib3.exceptions
from django.conf import settings
from django.db import connection

from core.secrets import REDACTED, is_secret_header, redact_headers
from execution.egress import EgressDenied, EgressPolicy, host_header, refused_header
from execution.outcomes import ErrorKind, Outcome
from execution.transport import (
    PinnedAdapter,
    ResponseHeadersTooLarge,
    begin_attempt,
    end_attempt,
    last_progress,
    may_send_again,
    new_connections_only,
)


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


class _DeadlineExceeded(Exception):
    pass


USER_AGENT = "ServiceAgent/1.0"

_local = threading.local()


def _adapter() -> PinnedAdapter:
    """This thread's adapter: its pools keep connections alive, and nothing else. Requests go
    straight to it, not through a Session, so no environment (proxy variables, .netrc), no
    redirect handling (requests would read a whole redirect body, uncapped, to look at it)
    and no cookie jar is ever involved."""
    adapter = getattr(_local, "adapter", None)
    if adapter is None:
        adapter = _local.adapter = PinnedAdapter(pool_connections=8, pool_maxsize=8, max_retries=0)
    return adapter


def encode_body(body: Any, headers: dict[str, str]) -> tuple[bytes | None, dict[str, str]]:
    """Strings go as they are; any other JSON value as JSON, with a content type if none."""
    if body is None:
        return None, headers
    if isinstance(body, str):
        return body.encode(), headers
    if not any(name.lower() == "content-type" for name in headers):
        headers = {**headers, "Content-Type": "application/json"}
    return json.dumps(body, separators=(",", ":")).encode(), headers


def wire_request(*, request: HttpRequest) -> requests.PreparedRequest:
    """The request as it goes on the wire. Its headers are the caller's plus those the agent
    adds (docs/security.md §2): User-Agent and Accept-Encoding: identity unless given,
    Content-Type for a JSON body unless given, Content-Length when there is a body (0 for a
    bodiless POST, PUT, PATCH or DELETE), Host, and the request's `agent_headers`. urllib3 and http.client add a header only
    when it is missing, so they add none. Raises ValueError for a URL that cannot be sent."""
    body, headers = encode_body(request.body, dict(request.headers))
    prepared = requests.PreparedRequest()
    # Later keys win case-insensitively: a caller's own User-Agent replaces the agent's.
    prepared.prepare(
        method=request.method,
        url=request.url,
        headers={"User-Agent": USER_AGENT, **headers, **request.agent_headers},
        data=body,
    )
    prepared.headers.setdefault("Accept-Encoding", "identity")  # what http.client sends unasked
    try:
        prepared.headers["Host"] = host_header(url=prepared.url or "")
    except ValueError:
        raise requests.exceptions.InvalidURL("the host is not a valid name or address") from None
    return prepared


def sent_headers(*, request: HttpRequest) -> dict[str, str]:
    """The headers `perform` sends for `request`, for the attempt log written before it goes
    out. For a URL that cannot be sent nothing goes out: the caller's headers are shown."""
    try:
        return dict(wire_request(request=request).headers)
    except ValueError:
        return encode_body(request.body, dict(request.headers))[1]


# --- The whole-attempt deadline -----------------------------------------------------------


class _DeadlineWatch:
    """One thread for every attempt's deadline (a heap), instead of a timer thread each."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, at: float, callback: Callable[[], None]) -> int:
        with self._cond:
            handle = next(self._counter)
            self._callbacks[handle] = callback
            heapq.heappush(self._heap, (at, handle))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="attempt-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()
            return handle

    def cancel(self, handle: int) -> None:
        with self._cond:
            self._callbacks.pop(handle, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._callbacks:
                    heapq.heappop(self._heap)  # cancelled
                if not self._heap:
                    self._cond.wait(1.0)
                    continue
                at, handle = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                callback = self._callbacks.pop(handle)
            try:
                callback()
            except Exception:  # a failing callback must not stop other attempts' deadlines
                pass


_deadlines = _DeadlineWatch()


# --- The attempt --------------------------------------------------------------------------


def perform(request: HttpRequest, *, policy: EgressPolicy | None = None) -> Outcome:
    """Send the request once and describe what happened. Never raises."""
    if connection.in_atomic_block:
        raise RuntimeError("no HTTP request inside a database transaction (docs/architecture.md)")
    started = time.monotonic()
    timeout_s = request.timeout_ms / 1000
    deadline = started + timeout_s
    secrets = secret_values(request.headers)

    def latency() -> int:
        return int((time.monotonic() - started) * 1000)

    def failure(kind: str, message: str, status: int | None = None) -> Outcome:
        return Outcome.failure(kind, _scrub(message, secrets), status=status, latency_ms=latency())

    def timed_out() -> Outcome:
        return failure(ErrorKind.TIMEOUT, f"no complete response within {request.timeout_ms} ms")

    refused = [name for name in request.headers if refused_header(name)]
    if refused:
        return failure(ErrorKind.EGRESS_DENIED, f"the header {refused[0]!r} is set by the agent and refused")

    sockets = begin_attempt(policy=policy, deadline=deadline)
    expired = threading.Event()

    def on_deadline() -> None:
        # Whole-attempt deadline: a slow-drip server cannot keep the attempt alive by sending
        # a byte just before each read timeout; shutting the socket unblocks the read.
        expired.set()
        for sock in list(sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    handle = _deadlines.arm(deadline, on_deadline)
    response = None
    try:
        response = _send(wire_request(request=request), deadline=deadline, expired=expired)
        if expired.is_set():  # the headers may have been cut short by the deadline
            raise _DeadlineExceeded
        snippet_bytes, truncated = _read_capped(response, deadline, expired)
    except EgressDenied as exc:
        return failure(ErrorKind.EGRESS_DENIED, str(exc))
    except _DeadlineExceeded:
        return timed_out()
    except Exception as exc:
        if expired.is_set() or time.monotonic() >= deadline:
            return timed_out()
        kind, message = describe_error(exc)
        return timed_out() if kind == ErrorKind.TIMEOUT else failure(kind, message)
    finally:
        _deadlines.cancel(handle)
        if response is not None:
            response.close()
        sockets.clear()
        end_attempt()

    # A target echoing the request (secret headers included) must not put the secrets in
    # the outcome: known secret values are scrubbed from the snippet and header values, and
    # secret response headers (Set-Cookie, ...) are redacted before anything stores them.
    snippet = _scrub(snippet_bytes.decode("utf-8", errors="replace"), secrets)
    headers_out = {
        _scrub(name, secrets): _scrub(value, secrets)
        for name, value in redact_headers(dict(list(response.headers.items())[: settings.RESPONSE_MAX_HEADERS])).items()
    }
    status = response.status_code
    if 200 <= status < 300:
        return Outcome(
            succeeded=True,
            status=status,
            headers=headers_out,
            body_snippet=snippet,
            body_truncated=truncated,
            latency_ms=latency(),
        )
    return Outcome(
        succeeded=False,
        status=status,
        headers=headers_out,
        body_snippet=snippet,
        body_truncated=truncated,
        latency_ms=latency(),
        error_kind=ErrorKind.HTTP_ERROR,
        error_message=_scrub(f"HTTP {status} {response.reason or ''}".strip()[:200], secrets),
    )


def _send(prepared: requests.PreparedRequest, *, deadline: float, expired: threading.Event) -> requests.Response:
    """Send the request; once more, on a new connection and within the same deadline, when a
    kept-alive connection failed before the target can have acted on it (may_send_again:
    the server closed it idle just as the request arrived, docs/security.md §3)."""
    try:
        return _adapter().send(prepared, stream=True, timeout=_time_left(deadline))
    except requests.exceptions.ConnectionError as exc:
        closed = _peer_closed(exc)
        if expired.is_set() or not may_send_again(
            method=prepared.method or "", progress=last_progress(), peer_closed=closed
        ):
            raise
    with new_connections_only():
        return _adapter().send(prepared, stream=True, timeout=_time_left(deadline))


def _time_left(deadline: float) -> tuple[float, float]:
    left = max(deadline - time.monotonic(), 0.001)
    return left, left


def _peer_closed(exc: BaseException) -> bool:
    """The peer ended the connection (EOF where a response should be, or a reset): not a
    timeout, not TLS, not a refused connect."""
    causes = list(_causes(exc))
    if any(isinstance(c, (TimeoutError, urllib3.exceptions.TimeoutError, ssl.SSLError)) for c in causes):
        return False
    return any(isinstance(c, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)) for c in causes)


def _read_capped(response: requests.Response, deadline: float, expired: threading.Event) -> tuple[bytes, bool]:
    """Read the body, after decompression, up to RESPONSE_BODY_MAX_BYTES and within the
    whole-attempt deadline. Only the snippet is kept: memory stays one chunk plus the
    snippet, whatever the cap. Returns (snippet, truncated)."""
    cap = settings.RESPONSE_BODY_MAX_BYTES
    keep = settings.RESPONSE_BODY_SNIPPET_BYTES
    snippet = bytearray()
    size = 0
    for chunk in response.iter_content(chunk_size=16384):
        if expired.is_set() or time.monotonic() > deadline:
            raise _DeadlineExceeded
        if len(snippet) < keep:
            snippet += chunk[: keep - len(snippet)]
        size += len(chunk)
        if size > cap:
            return bytes(snippet), True  # the rest is never read
    if expired.is_set():
        raise _DeadlineExceeded
    return bytes(snippet), size > keep


# --- Short, human error messages ----------------------------------------------------------


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps (requests and urllib3 nest them in args,
    `reason`, `__cause__` and `__context__`), breadth first, each once."""
    seen: set[int] = set()
    queue = [exc]
    while queue:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        nested = [*current.args, getattr(current, "reason", None), current.__cause__, current.__context__]
        queue.extend(item for item in nested if isinstance(item, BaseException))


_ERRNO_MESSAGES = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.ECONNABORTED: "connection aborted",
    errno.EPIPE: "connection closed while sending the request",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.EADDRNOTAVAIL: "address not available",
}


def describe_error(exc: BaseException) -> tuple[str, str]:
    """(ErrorKind, short message) for an exception raised by an attempt."""
    causes = list(_causes(exc))
    for cause in causes:
        if isinstance(cause, EgressDenied):
            return ErrorKind.EGRESS_DENIED, str(cause)
    for cause in causes:
        if isinstance(cause, socket.gaierror):
            if cause.errno == socket.EAI_AGAIN:
                return ErrorKind.NETWORK_ERROR, "name resolution failed temporarily"
            return ErrorKind.NETWORK_ERROR, "name does not resolve"
        if isinstance(cause, urllib3.exceptions.NameResolutionError):
            return ErrorKind.NETWORK_ERROR, "name does not resolve"
        if isinstance(cause, OSError) and cause.errno in _ERRNO_MESSAGES:
            return ErrorKind.NETWORK_ERROR, _ERRNO_MESSAGES[cause.errno]
    for cause in causes:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return ErrorKind.TLS_ERROR, f"certificate verify failed: {cause.verify_message}"[:200]
        if isinstance(cause, ssl.CertificateError):
            return ErrorKind.TLS_ERROR, "certificate does not match the host name"
        if isinstance(cause, ssl.SSLError):
            reason = getattr(cause, "reason", None) or "handshake failed"
            return ErrorKind.TLS_ERROR, f"TLS error: {str(reason).lower().replace('_', ' ')}"
    for cause in causes:
        if isinstance(cause, ResponseHeadersTooLarge):
            return ErrorKind.NETWORK_ERROR, str(cause)
        if isinstance(cause, http.client.LineTooLong):
            return ErrorKind.NETWORK_ERROR, "a response header line is too long"
        if isinstance(cause, http.client.RemoteDisconnected):
            return ErrorKind.NETWORK_ERROR, "connection closed before a response"
        if isinstance(cause, http.client.BadStatusLine):
            return ErrorKind.NETWORK_ERROR, "not an HTTP response"
        if isinstance(
            cause,
            (http.client.IncompleteRead, urllib3.exceptions.IncompleteRead, requests.exceptions.ChunkedEncodingError),
        ):
            return ErrorKind.NETWORK_ERROR, "the response body ended early"
        if isinstance(cause, (urllib3.exceptions.DecodeError, requests.exceptions.ContentDecodingError)):
            return ErrorKind.NETWORK_ERROR, "the response body could not be decompressed"
        if isinstance(cause, http.client.HTTPException) and "headers" in str(cause):
            return ErrorKind.NETWORK_ERROR, "the response has too many headers"
    for cause in causes:
        # urllib3's NewConnectionError subclasses its ConnectTimeoutError: not a timeout.
        if isinstance(cause, urllib3.exceptions.NewConnectionError):
            continue
        if isinstance(cause, (TimeoutError, urllib3.exceptions.TimeoutError, requests.exceptions.Timeout)):
            return ErrorKind.TIMEOUT, "timed out"
    for cause in causes:
        if isinstance(cause, (requests.exceptions.InvalidURL, urllib3.exceptions.LocationValueError)):
            return ErrorKind.NETWORK_ERROR, "the URL is not valid"
        if isinstance(cause, requests.exceptions.InvalidHeader):
            return ErrorKind.INTERNAL_ERROR, "a request header is not valid"
    for cause in causes:
        if isinstance(
            cause,
            (OSError, http.client.HTTPException, urllib3.exceptions.ProtocolError, requests.exceptions.ConnectionError),
        ):
            leaf = causes[-1]
            return ErrorKind.NETWORK_ERROR, _short(leaf if isinstance(leaf, OSError) else cause)
    return ErrorKind.INTERNAL_ERROR, f"{type(exc).__name__}: {_short(exc)}"


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    # urllib3 reprs its pool and connection objects in messages; keep the human part.
    if "<urllib3" in text or "HTTPConnectionPool(" in text:
        text = text.rsplit(": ", 1)[-1].strip(" ')\"")
    return text[:200]


def secret_values(headers: dict[str, Any]) -> list[str]:
    """What a target may echo of the secret headers: each whole value, and its parts a server
    quotes alone ("invalid token <credential>", "unknown session <cookie value>"): the credential
    after an auth scheme (and a Basic credential's decoded `user:password` and password), and
    each cookie's value. Longest first, so a whole value is scrubbed before its parts."""
    found: set[str] = set()
    for name, value in headers.items():
        if not (is_secret_header(name) and isinstance(value, str) and value.strip()):
            continue
        found.update((value, value.strip()))
        if name.lower() == "cookie":
            for pair in value.split(";"):
                found.add(pair.partition("=")[2].strip().strip('"'))
            continue
        words = value.split(None, 1)
        if len(words) < 2:
            continue
        scheme, credential = words[0], words[1].strip()
        found.add(credential)
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(credential, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                continue
            found.update((decoded, decoded.partition(":")[2]))
    return sorted((value for value in found if value), key=len, reverse=True)


def _scrub(message: str, secrets: list[str]) -> str:
    """No secret header value survives in a message, whatever library echoed it; and no NUL,
    which a hostile target may send but PostgreSQL's text and jsonb cannot store."""
    for value in secrets:
        # Shorter values would wreck the text around them (a cookie "id=1" is not worth it).
        if len(value) >= 4:
            message = message.replace(value, REDACTED)
    return message.replace("\x00", "\ufffd")
