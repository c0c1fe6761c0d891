"""The connections attempts use: pinned to the address the egress policy checked, with bounded
response headers, and kept alive between attempts without carrying anything else over.

A kept-alive connection has one known weakness: the server may close it (its idle timeout)
while a request is on its way. So a pooled connection idle longer than
POOLED_CONNECTION_MAX_IDLE_SECONDS is not reused, and the pool records what each request put on
the wire, for `may_send_again` to tell whether a request that failed may go once more
(docs/security.md §3).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from execution.egress import EgressDenied, EgressPolicy, Resolver

# Below the keep-alive timeout of common servers (gunicorn 2 s, the shortest; Apache and
# Node.js 5 s; nginx 75 s), with room for a close that is already on its way: a connection
# idle longer than this is closed and a new one opened, instead of racing the server's close.
POOLED_CONNECTION_MAX_IDLE_SECONDS = 1.0

# RFC 9110 §9.2.2: a client may send these again after a connection failure.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class ResponseHeadersTooLarge(http.client.HTTPException):
    """The response's header section exceeds the configured count or size."""


class ResolveTimeout(TimeoutError):
    """The name did not resolve before the attempt's deadline."""


@dataclass
class WireProgress:
    """What the latest request of this thread put on the wire and got back."""

    reused: bool = False  # sent on a kept-alive connection from the pool
    request_bytes: int = 0  # bytes of the request handed to the socket
    response_started: bool = False  # at least one byte of a response arrived


def may_send_again(*, method: str, progress: WireProgress, peer_closed: bool) -> bool:
    """Whether a failed request may go out once more, on a new connection, as part of the same
    attempt: only when it failed on a reused connection that the peer closed (EOF or reset,
    never a timeout) before a single response byte, and either not one byte of it was written
    (any method: the target cannot have seen it) or its method is idempotent. The caller does
    it at most once."""
    if not (progress.reused and peer_closed) or progress.response_started:
        return False
    return progress.request_bytes == 0 or method.upper() in IDEMPOTENT_METHODS


# --- The attempt's state in this thread (one attempt at a time per thread) ----------------

_wire = threading.local()


def begin_attempt(*, policy: EgressPolicy | None, deadline: float | None) -> list[socket.socket]:
    """Start an attempt in this thread: the policy the adapter applies (None: from settings),
    its time.monotonic() deadline (bounds name resolution too), fresh progress, and the list
    of the sockets it uses (shut down by its deadline)."""
    _wire.policy = policy
    _wire.deadline = deadline
    _wire.progress = WireProgress()
    _wire.new_only = False
    _wire.sockets = []
    return _wire.sockets


def end_attempt() -> None:
    _wire.policy = None
    _wire.deadline = None
    _wire.sockets = None


def last_progress() -> WireProgress:
    """The WireProgress of this thread's latest request."""
    return _progress()


@contextmanager
def new_connections_only() -> Iterator[None]:
    """Within the block, this thread's requests never reuse a pooled connection."""
    _wire.new_only = True
    try:
        yield
    finally:
        _wire.new_only = False


def _progress() -> WireProgress:
    progress = getattr(_wire, "progress", None)
    if progress is None:
        progress = _wire.progress = WireProgress()
    return progress


def _register(sock: socket.socket | None) -> None:
    sockets = getattr(_wire, "sockets", None)
    if sockets is not None and sock is not None:
        sockets.append(sock)


# --- Name resolution, bounded by the attempt's deadline -------------------------------------


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _within_deadline(resolver: Resolver) -> Resolver:
    """The resolver, abandoned (not awaited) when the attempt's deadline passes first: the C
    resolver cannot be interrupted, and a hung lookup must cost one attempt, not a worker
    thread held for the resolver's own (long) retries."""
    deadline = getattr(_wire, "deadline", None)
    if deadline is None:
        return resolver

    def bounded(host: str, port: int) -> list[str]:
        outcome: dict[str, object] = {}
        done = threading.Event()

        def lookup() -> None:
            try:
                outcome["addresses"] = resolver(host, port)
            except BaseException as exc:  # handed to the waiting thread
                outcome["error"] = exc
            done.set()

        threading.Thread(target=lookup, name="egress-resolve", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            raise ResolveTimeout(f"{host} did not resolve in time")
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return list(outcome["addresses"])  # type: ignore[call-overload]

    return bounded


# --- Bounded response headers -------------------------------------------------------------


class _HeaderBudget:
    """Wraps the response's reader while http.client reads the status line and headers:
    refuses more than `max_lines` header lines or `max_bytes` in all (1xx interim responses
    included: a server cannot stream "100 Continue" forever)."""

    def __init__(self, fp, max_lines: int, max_bytes: int) -> None:
        self._fp = fp
        self._lines_left = max_lines + 1  # the status line
        self._bytes_left = max_bytes
        self._max_lines = max_lines
        self._max_bytes = max_bytes

    def readline(self, limit: int = -1) -> bytes:
        if limit < 0 or limit > self._bytes_left + 1:
            limit = self._bytes_left + 1
        line = self._fp.readline(limit)
        self._bytes_left -= len(line)
        if self._bytes_left < 0:
            raise ResponseHeadersTooLarge(f"the response headers exceed {self._max_bytes} bytes")
        if line not in (b"\r\n", b"\n", b""):
            self._lines_left -= 1
            if self._lines_left < 0:
                raise ResponseHeadersTooLarge(f"the response has more than {self._max_lines} headers")
        return line

    def close(self) -> None:
        self._fp.close()

    def __getattr__(self, name: str):
        return getattr(self._fp, name)


class _BoundedHTTPResponse(http.client.HTTPResponse):
    def begin(self) -> None:
        if self.headers is not None:
            return
        # The reader is new and empty: peek's one read raises, or returns b"", when the
        # connection was closed before a single response byte (may_send_again).
        if self.fp.peek(1):
            _progress().response_started = True
        original = self.fp
        self.fp = _HeaderBudget(original, settings.RESPONSE_MAX_HEADERS, _max_header_bytes())
        try:
            super().begin()
        finally:
            if self.fp is not None:  # None when http.client already closed it
                self.fp = original


def _max_header_bytes() -> int:
    return getattr(settings, "RESPONSE_MAX_HEADER_BYTES", 64 * 1024)


# --- Connections and pools ----------------------------------------------------------------


class _TrackedConnectionMixin:
    """Registers its socket with the attempt and counts the request bytes it writes."""

    response_class = _BoundedHTTPResponse
    sock: socket.socket | None

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        _register(self.sock)

    def send(self, data) -> None:
        progress = _progress()
        if not isinstance(data, bytes | bytearray | memoryview):
            progress.request_bytes += 1  # a readable or iterable body: counted as written
            super().send(data)  # type: ignore[misc]
            return
        if self.sock is None:
            self.connect()  # as http.client's auto_open does
        # sendall() cannot say how much it wrote before failing; this loop can.
        view = memoryview(data).cast("B")
        while view:
            sent = self.sock.send(view)  # type: ignore[union-attr]
            progress.request_bytes += sent
            view = view[sent:]


class _TrackedHTTPConnection(_TrackedConnectionMixin, HTTPConnection):
    pass


class _TrackedHTTPSConnection(_TrackedConnectionMixin, HTTPSConnection):
    pass


class _TrackingPoolMixin:
    def _get_conn(self, timeout=None):
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        if conn.sock is not None:
            idle = time.monotonic() - getattr(conn, "idle_since", time.monotonic())
            if getattr(_wire, "new_only", False) or idle > POOLED_CONNECTION_MAX_IDLE_SECONDS:
                conn.close()  # urllib3 opens a new one on use
        _wire.progress = WireProgress(reused=conn.sock is not None)
        _register(conn.sock)  # a kept-alive connection is bounded by the deadline too
        return conn

    def _put_conn(self, conn) -> None:
        if conn is not None:
            conn.idle_since = time.monotonic()
        super()._put_conn(conn)  # type: ignore[misc]


class _PinnedHTTPPool(_TrackingPoolMixin, HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _PinnedHTTPSPool(_TrackingPoolMixin, HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


class PinnedAdapter(HTTPAdapter):
    """A requests adapter that checks the egress policy and connects to the checked address.
    Proxies are never used: the pool is always the target's own."""

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _PinnedHTTPPool, "https": _PinnedHTTPSPool}

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        raise EgressDenied("proxies are not used for egress")

    def get_connection_with_tls_context(self, request, verify, proxies=None, cert=None):
        policy = getattr(_wire, "policy", None) or EgressPolicy.from_settings()
        target = policy.resolve(request.url, lookup=_within_deadline(policy.resolver or system_resolver))
        request.headers["Host"] = target.host_header()
        pool_kwargs: dict[str, object] = {}
        if target.scheme == "https":
            _, pool_kwargs = self.build_connection_pool_key_attributes(request, verify, cert)
            pool_kwargs = dict(pool_kwargs)
            # TLS is verified against the name in the URL, not the pinned address.
            pool_kwargs["server_hostname"] = target.host
            pool_kwargs["assert_hostname"] = target.host
        return self.poolmanager.connection_from_host(
            target.address, port=target.port, scheme=target.scheme, pool_kwargs=pool_kwargs
        )
