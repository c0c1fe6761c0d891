"""One HTTP attempt on urllib3: no redirects, no proxies, bounded in time and size.

Never call this inside a database transaction (docs/architecture.md); `perform` checks.

Nothing but connections outlives an attempt: there is no session (a `requests.Session`'s
cookie jar, default headers and auth would carry one call's state into the next, of any
tenant), only per-thread pools that keep connections alive (execution/transport.py). An
attempt sends exactly `wire_request`'s headers (execution/wire.py), which the attempt log records
(docs/security.md §2).

The request is what `requests` would send (its URL preparation, header checks, body framing and
URL credentials: `wire_request`), sent with urllib3 directly: requests' per-call machinery
(PreparedRequest, adapter, Response, a cookie jar filled from every response) cost more than
the rest of the attempt. Errors are raised as requests raised them, so `describe_error` (execution/messages.py) and
the retry-once rule (`may_send_again`) see the same exceptions.

Bounds (docs/security.md): one deadline for the whole attempt (resolution, connect, headers
and body: a server dripping a byte at a time cannot stretch it), at most
RESPONSE_MAX_HEADERS headers in RESPONSE_MAX_HEADER_BYTES, and at most
RESPONSE_BODY_MAX_BYTES of body read *after* decompression (urllib3 2.8 inflates
incrementally, never more than it is asked for), of which only the snippet is kept: a gzip
bomb or an endless body costs one chunk of memory and a bounded read, not its expanded size.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import requests
import urllib3.exceptions
from django.conf import settings
from django.db import connection
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

from execution.egress import EgressDenied, EgressPolicy, Target
from execution.messages import describe_error, error_chain, header_refusal, response_outcome, scrub, secret_values
from execution.outcomes import ErrorKind, Outcome
from execution.transport import (
    PinnedPools,
    begin_attempt,
    checked_target,
    end_attempt,
    last_progress,
    may_send_again,
    new_connections_only,
)
from execution.wire import HttpRequest, Wire, wire_for


class _DeadlineExceeded(Exception):
    pass


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


def perform(request: HttpRequest, *, policy: EgressPolicy | None = None, keep_bytes: int | None = None) -> Outcome:
    """Send the request once and describe what happened. Never raises. The answer's body is kept
    up to RESPONSE_BODY_SNIPPET_BYTES, or `keep_bytes` (an OAuth2 token answer, read whole)."""
    if connection.in_atomic_block:
        raise RuntimeError("no HTTP request inside a database transaction (docs/architecture.md)")
    started = time.monotonic()
    timeout_s = request.timeout_ms / 1000
    deadline = started + timeout_s
    secrets = [*secret_values(request.headers), *(value for value in request.secrets if value)]

    def latency() -> int:
        return int((time.monotonic() - started) * 1000)

    def failure(kind: str, message: str, status: int | None = None) -> Outcome:
        return Outcome.failure(kind, scrub(message, secrets), status=status, latency_ms=latency())

    def timed_out() -> Outcome:
        return failure(ErrorKind.TIMEOUT, f"no complete response within {request.timeout_ms} ms")

    if request.cannot_send:
        return failure(ErrorKind.INTERNAL_ERROR, request.cannot_send)
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
        response = _send(wire_for(request), deadline=deadline, expired=expired)
        if expired.is_set():  # the headers may have been cut short by the deadline
            raise _DeadlineExceeded
        snippet_bytes, truncated, consumed = _read_capped(response, deadline, expired, keep_bytes)
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
    causes = list(error_chain(exc))
    if any(isinstance(c, (TimeoutError, urllib3.exceptions.TimeoutError, ssl.SSLError)) for c in causes):
        return False
    return any(isinstance(c, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)) for c in causes)


def _read_capped(
    response: HTTPResponse, deadline: float, expired: threading.Event, keep_bytes: int | None = None
) -> tuple[bytes, bool, bool]:
    """Read the body, after decompression, up to RESPONSE_BODY_MAX_BYTES and within the
    whole-attempt deadline. Only the snippet is kept: memory stays one chunk plus the
    snippet, whatever the cap. Returns (snippet, truncated, read to its end)."""
    cap = settings.RESPONSE_BODY_MAX_BYTES
    keep = settings.RESPONSE_BODY_SNIPPET_BYTES if keep_bytes is None else min(keep_bytes, cap)
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
