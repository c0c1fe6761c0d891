"""The connections attempts use: pinned to the address the egress policy checked, with bounded
response headers, and kept alive between attempts without carrying anything else over.

urllib3 is used directly (execution/http.py): each thread keeps a PoolManager whose pools are
keyed by the checked address, never by a name, so urllib3 resolves nothing, reads no proxy
variable and no .netrc, and has no cookie jar.

A kept-alive connection has one known weakness: the server may close it (its idle timeout)
while a request is on its way. So a pooled connection idle longer than
POOLED_CONNECTION_MAX_IDLE_SECONDS is not reused, and the pool records what each request put on
the wire, for `may_send_again` to tell whether a request that failed may go once more
(docs/security.md §3).
"""

from __future__ import annotations

import http.client
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from requests.utils import DEFAULT_CA_BUNDLE_PATH
from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import LocationValueError

from execution.egress import EgressPolicy, Resolver, Target

# Below the keep-alive timeout of common servers (gunicorn 2 s, the shortest; Apache and
# Node.js 5 s; nginx 75 s), with room for a close that is already on its way: a connection
# idle longer than this is closed and a new one opened, instead of racing the server's close.
POOLED_CONNECTION_MAX_IDLE_SECONDS = 1.0

# A request body up to this size goes out in the same send() as the request head: one system
# call (and one segment on the wire) instead of two. Larger bodies follow the head as before.
COALESCED_BODY_MAX_BYTES = 64 * 1024

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
    """Start an attempt in this thread: the policy the pinned pools apply (None: from settings),
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


class _LookupThreads:
    """Threads that run name lookups, kept for reuse: handing a lookup to an idle thread costs
    a fraction of starting one. A lookup never waits for a thread: when none is idle (they are
    all busy, or held by hung lookups an attempt has abandoned), a new one starts. A thread
    idle for IDLE_SECONDS ends."""

    IDLE_SECONDS = 30.0

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # threads do not survive a fork

    def _reset(self) -> None:
        self._lock = threading.Lock()
        # Threads waiting for work = idle + lookups queued (each queued one took an idle thread).
        self._idle = 0
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put(job)
                return
        threading.Thread(target=self._work, args=(job,), name="egress-resolve", daemon=True).start()

    def _work(self, job: Callable[[], None]) -> None:
        jobs = self._jobs
        while True:
            job()
            job = None  # type: ignore[assignment]  # drop its references while idle
            with self._lock:
                if jobs is not self._jobs:  # forked: this is a stale thread object's loop
                    return
                self._idle += 1
            while job is None:
                try:
                    job = jobs.get(timeout=self.IDLE_SECONDS)
                except queue.Empty:
                    with self._lock:
                        if self._idle:  # no lookup is queued for this thread: it may end
                            self._idle -= 1
                            return


_lookup_threads = _LookupThreads()


def run_lookup(job: Callable[[], None]) -> None:
    """Run `job` (a name lookup) on an idle lookup thread or a new one: it never waits for
    another lookup, and a hung one holds only its own thread (execution/aio.py)."""
    _lookup_threads.run(job)


def _within_deadline(resolver: Resolver) -> Resolver:
    """The resolver, abandoned (not awaited) when the attempt's deadline passes first: the C
    resolver cannot be interrupted, and a hung lookup must cost one attempt, not a worker
    thread held for the resolver's own (long) retries."""
    deadline = getattr(_wire, "deadline", None)
    if deadline is None:
        return resolver

    def bounded(host: str, port: int) -> list[str]:
        outcome: dict[str, object] = {}
        done = threading.Lock()  # held until the lookup ends (cheaper than an Event)
        done.acquire()

        def lookup() -> None:
            try:
                outcome["addresses"] = resolver(host, port)
            except BaseException as exc:  # handed to the waiting thread
                outcome["error"] = exc
            done.release()

        _lookup_threads.run(lookup)
        if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
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
    """Registers its socket with the attempt and counts the request bytes it writes. A small
    body with its Content-Length given goes out with the request head, in one send()."""

    response_class = _BoundedHTTPResponse
    sock: socket.socket | None
    _body_tail: bytes | None = None

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        _register(self.sock)

    def request(self, method, url, body=None, headers=None, **kwargs) -> None:
        if (
            isinstance(body, bytes)
            and 0 < len(body) <= COALESCED_BODY_MAX_BYTES
            and not kwargs.get("chunked")
            and headers is not None
            and any(name.lower() == "content-length" for name in headers)
        ):
            # urllib3 frames nothing itself when Content-Length is given, so without a body
            # it sends exactly the head, in one send(): the body is appended to it there.
            self._body_tail = body
            try:
                super().request(method, url, body=None, headers=headers, **kwargs)  # type: ignore[misc]
            finally:
                self._body_tail = None
            return
        super().request(method, url, body=body, headers=headers, **kwargs)  # type: ignore[misc]

    def send(self, data) -> None:
        tail = self._body_tail
        if tail is not None:
            self._body_tail = None
            data = bytes(data) + tail
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


def checked_target(url: str) -> Target:
    """Resolve `url`'s host once, under this attempt's policy (None: from settings) and within
    its deadline, and check every address: the Target to connect to. Raises EgressDenied, or
    what the lookup raises (socket.gaierror, ResolveTimeout)."""
    policy = getattr(_wire, "policy", None) or EgressPolicy.from_settings()
    return policy.resolve(url, lookup=_within_deadline(policy.resolver or system_resolver))


class PinnedPools:
    """One thread's connection pools (a urllib3 PoolManager of at most 8 pools of 8 kept-alive
    connections), keyed by the checked address. Proxies are never used: the pool is always
    the target's own."""

    def __init__(self) -> None:
        self.manager = PoolManager(num_pools=8, maxsize=8, block=False)
        self.manager.pool_classes_by_scheme = {"http": _PinnedHTTPPool, "https": _PinnedHTTPSPool}
        # Per target, the manager's pool key and context, as its connection_from_host builds
        # them: building a key (a 30-field tuple) cost more than finding the pool with it.
        self._keys: dict[tuple[str, str, int, str], tuple[object, dict[str, object]]] = {}

    def pool_for(self, target: Target) -> HTTPConnectionPool:
        if target.scheme == "https" and not os.path.exists(DEFAULT_CA_BUNDLE_PATH):
            raise OSError(
                f"Could not find a suitable TLS CA certificate bundle, invalid path: {DEFAULT_CA_BUNDLE_PATH}"
            )
        ident = (target.scheme, target.address, target.port, target.host)
        known = self._keys.get(ident)
        if known is None:
            if not target.address:
                raise LocationValueError("No host specified.")
            context: dict[str, object] = dict(self.manager.connection_pool_kw)
            if target.scheme == "https":
                # Verified against requests' CA bundle (certifi), as before, and against the
                # name in the URL, not the pinned address.
                context.update(
                    cert_reqs="CERT_REQUIRED",
                    ca_certs=DEFAULT_CA_BUNDLE_PATH,
                    server_hostname=target.host,
                    assert_hostname=target.host,
                )
            context.update(scheme=target.scheme, port=target.port, host=target.address)
            if len(self._keys) >= 64:
                self._keys.clear()
            known = self._keys[ident] = (self.manager.key_fn_by_scheme[target.scheme](context), context)
        pool_key, context = known
        # The manager keeps its most recently used pools (and closes the one it drops) as ever.
        return self.manager.connection_from_pool_key(pool_key, request_context=dict(context))
