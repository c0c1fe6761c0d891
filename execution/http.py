"""One HTTP attempt on urllib3: no redirects, no proxies, bounded in time and size.

Never call this inside a database transaction (docs/architecture.md); `perform` checks.

Nothing but connections outlives an attempt: there is no session (a `requests.Session`'s
cookie jar, default headers and auth would carry one call's state into the next, of any
tenant), only per-thread pools that keep connections alive (execution/transport.py). An
attempt sends exactly `wire_request`'s headers, which the attempt log records
(docs/security.md §2).

The request is what `requests` would send (its URL preparation, header checks, body framing and
URL credentials: `wire_request`), sent with urllib3 directly: requests' per-call machinery
(PreparedRequest, adapter, Response, a cookie jar filled from every response) cost more than
the rest of the attempt. Errors are raised as requests raised them, so `describe_error` and
the retry-once rule (`may_send_again`) see the same exceptions.

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
from urllib.parse import urlsplit

import requests
import urllib3.exceptions
from django.conf import settings
from django.db import connection
from requests.auth import HTTPBasicAuth
from requests.utils import check_header_validity, get_auth_from_url, to_native_string
from urllib3.exceptions import (
    ClosedPoolError,
    ConnectTimeoutError,
    DecodeError,
    LocationValueError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    ResponseError,
)
from urllib3.exceptions import HTTPError as _HTTPError
from urllib3.exceptions import InvalidHeader as _InvalidHeader
from urllib3.exceptions import ProxyError as _ProxyError
from urllib3.exceptions import SSLError as _SSLError
from urllib3.response import HTTPResponse
from urllib3.util import Retry
from urllib3.util import Timeout as TimeoutSauce

from core.secrets import REDACTED, redact_headers, secret_header_name
from execution.egress import EgressDenied, EgressPolicy, Target, client_url, host_header, refused_header
from execution.outcomes import ErrorKind, Outcome
from execution.transport import (
    PinnedPools,
    ResponseHeadersTooLarge,
    begin_attempt,
    checked_target,
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

# urllib3 retries nothing (a read error is raised as it is), and a connect error is raised
# wrapped in MaxRetryError: as requests' adapter configured it (max_retries=0).
_NO_RETRIES = Retry(0, read=False)


def _pools() -> PinnedPools:
    """This thread's pools: they keep connections alive, and nothing else. No environment
    (proxy variables, .netrc), no redirect handling (requests would read a whole redirect
    body, uncapped, to look at it) and no cookie jar is ever involved."""
    pools = getattr(_local, "pools", None)
    if pools is None:
        pools = _local.pools = PinnedPools()
    return pools


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


def _wire_for(request: HttpRequest) -> Wire:
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
    """The body `perform` sends for `request` (encoded once, with its headers: `_wire_for`), for
    the attempt log; for a request that cannot be sent, its encoding all the same."""
    try:
        return _wire_for(request).body
    except ValueError:
        return encode_body(request.body, dict(request.headers))[0]


def sent_headers(*, request: HttpRequest) -> dict[str, str]:
    """The headers `perform` sends for `request`, for the attempt log written before it goes
    out. For a URL that cannot be sent nothing goes out: the caller's headers are shown."""
    try:
        return dict(_wire_for(request).headers)
    except ValueError:
        return encode_body(request.body, dict(request.headers))[1]


# --- The whole-attempt deadline -----------------------------------------------------------


class _DeadlineWatch:
    """One thread for every attempt's deadline (a heap), instead of a timer thread each.

    The thread is woken only when a new deadline comes before every other one: it always
    sleeps until the earliest entry at most, so a later deadline needs no wake-up (attempts
    with equal timeouts arm deadlines in increasing order, and would otherwise wake it, a
    thread switch, on every attempt). Cancelled entries stay in the heap until they reach its
    top, or until they outnumber the live ones (then the heap is rebuilt)."""

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
            if self._heap[0][1] == handle:  # earlier than every other deadline
                self._cond.notify()
            return handle

    def cancel(self, handle: int) -> None:
        with self._cond:
            self._callbacks.pop(handle, None)
            if len(self._heap) > 64 + 2 * len(self._callbacks):
                self._heap = [entry for entry in self._heap if entry[1] in self._callbacks]
                heapq.heapify(self._heap)

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
        return Outcome.failure(kind, scrub(message, secrets), status=status, latency_ms=latency())

    def timed_out() -> Outcome:
        return failure(ErrorKind.TIMEOUT, f"no complete response within {request.timeout_ms} ms")

    refusal = header_refusal(request.headers)
    if refusal:
        return failure(ErrorKind.EGRESS_DENIED, refusal)

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
    consumed = False  # the whole body was read: the connection goes back to the pool
    try:
        response = _send(_wire_for(request), deadline=deadline, expired=expired)
        if expired.is_set():  # the headers may have been cut short by the deadline
            raise _DeadlineExceeded
        snippet_bytes, truncated, consumed = _read_capped(response, deadline, expired)
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
            # As requests' Response.close(): a body not read to its end closes the connection.
            if not consumed:
                response.close()
            response.release_conn()
        sockets.clear()
        end_attempt()

    received = response.headers
    return response_outcome(
        status=response.status,
        reason=response.reason,
        # One entry per name, in the order first seen, repeated fields joined with ", " (as
        # requests' Response.headers showed them).
        headers={name: received[name] for name in itertools.islice(received, settings.RESPONSE_MAX_HEADERS)},
        snippet=snippet_bytes,
        truncated=truncated,
        secrets=secrets,
        latency_ms=latency(),
    )


def header_refusal(headers: dict[str, Any]) -> str | None:
    """Why a request is refused before anything is sent (a header the agent sets itself, or a
    hop-by-hop one: egress.refused_header), or None."""
    refused = next((name for name in headers if refused_header(name)), None)
    return None if refused is None else f"the header {refused!r} is set by the agent and refused"


def response_outcome(
    *,
    status: int,
    reason: str | None,
    headers: dict[str, str],
    snippet: bytes,
    truncated: bool,
    secrets: list[str],
    latency_ms: int,
) -> Outcome:
    """The Outcome of a response: 2xx succeeded, anything else an HTTP error with its status.
    A target echoing the request (secret headers included) must not put the secrets in the
    outcome: known secret values are scrubbed from the snippet and header values, and secret
    response headers (Set-Cookie, ...) are redacted before anything stores them."""
    text = scrub(snippet.decode("utf-8", errors="replace"), secrets)
    headers_out = {scrub(name, secrets): scrub(value, secrets) for name, value in redact_headers(headers).items()}
    if 200 <= status < 300:
        return Outcome(
            succeeded=True,
            status=status,
            headers=headers_out,
            body_snippet=text,
            body_truncated=truncated,
            latency_ms=latency_ms,
        )
    return Outcome(
        succeeded=False,
        status=status,
        headers=headers_out,
        body_snippet=text,
        body_truncated=truncated,
        latency_ms=latency_ms,
        error_kind=ErrorKind.HTTP_ERROR,
        error_message=scrub(f"HTTP {status} {reason or ''}".strip()[:200], secrets),
    )


def _send(wire: Wire, *, deadline: float, expired: threading.Event) -> HTTPResponse:
    """Resolve and check the target once, then send the request; once more, on a new
    connection to the same checked address and within the same deadline, when a kept-alive
    connection failed before the target can have acted on it (may_send_again: the server
    closed it idle just as the request arrived, docs/security.md §3)."""
    target = checked_target(wire.url)
    try:
        return _urlopen(target, wire, deadline)
    except requests.exceptions.ConnectionError as exc:
        closed = _peer_closed(exc)
        if expired.is_set() or not may_send_again(method=wire.method, progress=last_progress(), peer_closed=closed):
            raise
    with new_connections_only():
        return _urlopen(target, wire, deadline)


def _urlopen(target: Target, wire: Wire, deadline: float) -> HTTPResponse:
    """One send on this thread's pool for the checked address; the response's body is left
    unread. urllib3's errors are raised as requests' adapter raised them (describe_error and
    _peer_closed read these)."""
    try:
        pool = _pools().pool_for(target)
    except LocationValueError as e:
        raise requests.exceptions.InvalidURL(e) from e
    left = max(deadline - time.monotonic(), 0.001)
    try:
        return pool.urlopen(
            method=wire.method,
            url=wire.target,
            body=wire.body,
            headers=wire.headers,
            redirect=False,
            assert_same_host=False,
            preload_content=False,
            decode_content=False,
            retries=_NO_RETRIES,
            timeout=TimeoutSauce(connect=left, read=left),
            chunked=wire.chunked,
        )
    except (ProtocolError, OSError) as err:
        raise requests.exceptions.ConnectionError(err) from err
    except MaxRetryError as e:
        if isinstance(e.reason, ConnectTimeoutError) and not isinstance(e.reason, NewConnectionError):
            raise requests.exceptions.ConnectTimeout(e) from e
        if isinstance(e.reason, ResponseError):
            raise requests.exceptions.RetryError(e) from e
        if isinstance(e.reason, _ProxyError):
            raise requests.exceptions.ProxyError(e) from e
        if isinstance(e.reason, _SSLError):
            raise requests.exceptions.SSLError(e) from e
        raise requests.exceptions.ConnectionError(e) from e
    except ClosedPoolError as e:
        raise requests.exceptions.ConnectionError(e) from e
    except _ProxyError as e:
        raise requests.exceptions.ProxyError(e) from e
    except (_SSLError, _HTTPError) as e:
        if isinstance(e, _SSLError):
            raise requests.exceptions.SSLError(e) from e
        if isinstance(e, ReadTimeoutError):
            raise requests.exceptions.ReadTimeout(e) from e
        if isinstance(e, _InvalidHeader):
            raise requests.exceptions.InvalidHeader(e) from e
        raise


def _peer_closed(exc: BaseException) -> bool:
    """The peer ended the connection (EOF where a response should be, or a reset): not a
    timeout, not TLS, not a refused connect."""
    causes = list(_causes(exc))
    if any(isinstance(c, (TimeoutError, urllib3.exceptions.TimeoutError, ssl.SSLError)) for c in causes):
        return False
    return any(isinstance(c, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)) for c in causes)


def _read_capped(response: HTTPResponse, deadline: float, expired: threading.Event) -> tuple[bytes, bool, bool]:
    """Read the body, after decompression, up to RESPONSE_BODY_MAX_BYTES and within the
    whole-attempt deadline. Only the snippet is kept: memory stays one chunk plus the
    snippet, whatever the cap. Returns (snippet, truncated, read to its end)."""
    cap = settings.RESPONSE_BODY_MAX_BYTES
    keep = settings.RESPONSE_BODY_SNIPPET_BYTES
    snippet = bytearray()
    size = 0
    for chunk in _body_chunks(response):
        if expired.is_set() or time.monotonic() > deadline:
            raise _DeadlineExceeded
        if len(snippet) < keep:
            snippet += chunk[: keep - len(snippet)]
        size += len(chunk)
        if size > cap:
            return bytes(snippet), True, False  # the rest is never read
    if expired.is_set():
        raise _DeadlineExceeded
    return bytes(snippet), size > keep, True


def _body_chunks(response: HTTPResponse) -> Iterator[bytes]:
    """The body in decompressed chunks of 16 KiB at most, urllib3's errors raised as requests'
    Response.iter_content raised them."""
    try:
        yield from response.stream(16384, decode_content=True)
    except ProtocolError as e:
        raise requests.exceptions.ChunkedEncodingError(e) from e
    except DecodeError as e:
        raise requests.exceptions.ContentDecodingError(e) from e
    except ReadTimeoutError as e:
        raise requests.exceptions.ConnectionError(e) from e
    except _SSLError as e:
        raise requests.exceptions.SSLError(e) from e


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
    patterns = tuple(settings.SECRET_HEADER_PATTERNS)  # read once, not once per header
    for name, value in headers.items():
        if not (secret_header_name(name, patterns) and isinstance(value, str) and value.strip()):
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


def scrub(message: str, secrets: list[str]) -> str:
    """No secret header value survives in a message, whatever library echoed it; and no NUL,
    which a hostile target may send but PostgreSQL's text and jsonb cannot store."""
    for value in secrets:
        # Shorter values would wreck the text around them (a cookie "id=1" is not worth it).
        if len(value) >= 4:
            message = message.replace(value, REDACTED)
    return message.replace("\x00", "\ufffd")
