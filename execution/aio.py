"""Many HTTP requests at once on one asyncio loop: how webhooks go out (delivery/runner.py).

`perform` (execution/http.py) holds a thread for each request, and around urllib3 it keeps a
deadline timer and the wire bookkeeping that lets it send an idempotent request once more. In a
burst, event delivery spent half the workers' CPU in that path and in handing each try to a
thread of its own (bench/HISTORY.md, 'Before and after: webhook tries on an asyncio loop'). Here
one loop, in a daemon thread of the process, sends every request with aiohttp: a caller hands
requests over with a callback and never waits.

The same request and the same rules as `perform` (docs/security.md §3):
- `wire_request` makes the request, so the same headers go out, and aiohttp adds none of its
  own;
- the egress policy resolves the URL's host (on perform's lookup threads: a hung lookup holds
  its own thread and its try, never another's) and checks every address before anything
  connects, and the connection goes to the checked address: the URL handed to aiohttp names
  the address, the Host header and TLS's server name the URL's host, and its pool is keyed by
  both;
- no redirects, no proxy and no .netrc (`trust_env` off), no cookies (a jar that keeps none),
  no decompression (the request asks for `identity`; a snippet is kept as it came);
- at most RESPONSE_MAX_HEADERS headers, each line at most HEADER_LINE_MAX_BYTES (aiohttp
  bounds lines, not the header block as `perform` does: RESPONSE_MAX_HEADER_BYTES caps the
  line too when it is lower), and at most RESPONSE_BODY_MAX_BYTES of body read, of which only
  the snippet is kept;
- one deadline for the whole request: resolution, connect, headers and body (interim 1xx
  responses are bounded by it, not counted as perform counts them);
- a kept-alive connection idle for POOLED_CONNECTION_MAX_IDLE_SECONDS is closed, not reused.
What `perform` does and this does not: send a request a second time (aiohttp's own resend of an
idempotent request is turned off too). A try that a closing kept-alive connection cut short
fails, and the delivery schedule tries it again.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import itertools
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import aiohttp
from aiohttp import http_exceptions
from django.conf import settings
from django.db import connection
from requests.utils import DEFAULT_CA_BUNDLE_PATH
from yarl import URL

from execution.egress import (
    EgressDenied,
    EgressPolicy,
    Target,
    client_host,
    default_port,
    parse_ip_literal,
)
from execution.messages import describe_error, header_refusal, response_outcome, scrub, secret_values
from execution.outcomes import ErrorKind, Outcome
from execution.transport import POOLED_CONNECTION_MAX_IDLE_SECONDS, run_lookup, system_resolver
from execution.wire import HttpRequest, wire_request

logger = logging.getLogger(__name__)

Done = Callable[[Outcome], None]

# Connections kept per checked address (and TLS server name): as many requests to one receiver
# run at once as the caller lets out (delivery: DELIVERY_PER_SUBSCRIPTION), these many share
# kept-alive connections, the rest wait for one.
CONNECTIONS_PER_TARGET = 64

# How much longer than its longest deadline `perform_many` waits before it calls a request lost
# (only a loop that stopped answering leaves one unanswered).
LOOP_GRACE_SECONDS = 5.0

# aiohttp's default, and the common servers' (nginx's large_client_header_buffers, Apache's
# LimitRequestFieldSize): with RESPONSE_MAX_HEADERS of them, what a response's headers may hold.
HEADER_LINE_MAX_BYTES = 8190


class Sender:
    """One asyncio loop in a daemon thread with aiohttp sessions, started on first use in the
    process that uses it: a forked worker starts its own, and a loop thread that died is
    replaced."""

    def __init__(self) -> None:
        self._reset()
        # The parent's sessions stay referenced, unused, in a child: dropped, each would log an
        # "unclosed session" warning from the child.
        self._orphans: list[object] = []
        os.register_at_fork(after_in_child=self._after_fork)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Written only on the loop's thread: a session per set of header bounds (settings a test
        # may change), each with its own connections; the requests out (the loop keeps only
        # weak references to its tasks).
        self._sessions: dict[tuple[int, int], aiohttp.ClientSession] = {}
        self._tasks: set[asyncio.Task[Outcome]] = set()
        self._tls: ssl.SSLContext | None = None

    def _after_fork(self) -> None:
        self._orphans.append(self._sessions)
        self._reset()

    def submit(self, requests: Sequence[tuple[HttpRequest, Done]], *, policy: EgressPolicy | None = None) -> None:
        """Send each request and call its `done` with the Outcome, on the loop's thread (so
        `done` must not block); never raises for a request's failure, which is its Outcome."""
        if requests:
            loop = self._running_loop()
            if threading.current_thread() is self._thread:
                # From a callback on the loop's own thread (a try that came back starting the
                # next): no wake-up of the loop through its self-pipe, which is a system call.
                loop.call_soon(self._start, list(requests), policy)
            else:
                loop.call_soon_threadsafe(self._start, list(requests), policy)

    def perform_many(self, requests: Sequence[HttpRequest], *, policy: EgressPolicy | None = None) -> list[Outcome]:
        """Send the requests at once and wait for every Outcome (from a plain thread, never
        inside a database transaction: docs/architecture.md)."""
        if connection.in_atomic_block:
            raise RuntimeError("no HTTP request inside a database transaction (docs/architecture.md)")
        outcomes: list[Outcome | None] = [None] * len(requests)
        left = [len(requests)]
        finished = threading.Event()
        count = threading.Lock()

        def done_at(index: int) -> Done:
            def done(outcome: Outcome) -> None:
                outcomes[index] = outcome
                with count:
                    left[0] -= 1
                    if not left[0]:
                        finished.set()

            return done

        if requests:
            self.submit([(request, done_at(index)) for index, request in enumerate(requests)], policy=policy)
            # Each request ends by its own deadline; this bound only guards against a loop gone.
            if not finished.wait(max(request.timeout_ms for request in requests) / 1000 + LOOP_GRACE_SECONDS):
                lost = Outcome.failure(ErrorKind.INTERNAL_ERROR, "the HTTP sender's loop did not answer")
                return [outcome or lost for outcome in outcomes]
        return outcomes  # type: ignore[return-value]  # every index is set before `finished`

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="http-sender", daemon=True)
                thread.start()
                self._loop, self._thread, self._sessions, self._tasks = loop, thread, {}, set()
                atexit.register(self._close, loop)
            return self._loop

    def _close(self, loop: asyncio.AbstractEventLoop) -> None:
        """At the exit of a process that used it (a command, the tests; a worker process ends
        without exit handlers): the sessions' connections closed, within a second."""
        if self._loop is not loop:
            return

        async def close() -> None:
            for session in list(self._sessions.values()):
                await session.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), loop).result(1)
        except Exception:  # exiting anyway
            pass

    # On the loop's thread.

    def _start(self, requests: list[tuple[HttpRequest, Done]], policy: EgressPolicy | None) -> None:
        for request, done in requests:
            task = asyncio.ensure_future(self._perform(request, policy))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._report, done=done))

    def _report(self, task: asyncio.Task[Outcome], *, done: Done) -> None:
        self._tasks.discard(task)
        try:
            outcome = task.result()
        except BaseException as exc:  # a bug, or the loop cancelling it: a failed request, not a lost one
            outcome = Outcome.failure(ErrorKind.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"[:1000])
        try:
            done(outcome)
        except BaseException:  # the caller's bug: logged, and the loop goes on
            logger.exception("the callback of a request failed")

    def _session(self) -> aiohttp.ClientSession:
        bounds = (settings.RESPONSE_MAX_HEADERS, settings.RESPONSE_MAX_HEADER_BYTES)
        session = self._sessions.get(bounds)
        if session is None:
            connector = aiohttp.TCPConnector(
                limit=0,
                limit_per_host=CONNECTIONS_PER_TARGET,
                keepalive_timeout=POOLED_CONNECTION_MAX_IDLE_SECONDS,
                use_dns_cache=False,  # the URL names the checked address: nothing is resolved
                ssl=self._tls_context(),
            )
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None),  # the request's own deadline bounds it
                max_headers=bounds[0],
                max_line_size=min(bounds[1], HEADER_LINE_MAX_BYTES),
                max_field_size=min(bounds[1], HEADER_LINE_MAX_BYTES),
                # wire_request's headers are all that is sent: none of aiohttp's defaults.
                skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            )
            # aiohttp sends an idempotent request once more after a connection error, even on a
            # new connection; perform's own rule (docs/security.md §3) is stricter, and here
            # nothing is sent twice. (A private attribute of the pinned aiohttp: the test of it,
            # tests/execution/test_aio_sender.py, fails should it change.)
            session._retry_connection = False
            self._sessions[bounds] = session
        return session

    def _tls_context(self) -> ssl.SSLContext:
        """Certificates verified against the bundle requests (and so `perform`) trusts."""
        if self._tls is None:
            self._tls = ssl.create_default_context(
                cafile=DEFAULT_CA_BUNDLE_PATH if os.path.exists(DEFAULT_CA_BUNDLE_PATH) else None
            )
        return self._tls

    async def _perform(self, request: HttpRequest, policy: EgressPolicy | None) -> Outcome:
        started = time.monotonic()
        secrets = secret_values(request.headers)

        def latency() -> int:
            return int((time.monotonic() - started) * 1000)

        def failure(kind: str, message: str) -> Outcome:
            return Outcome.failure(kind, scrub(message, secrets), latency_ms=latency())

        refusal = header_refusal(request.headers)
        if refusal:
            return failure(ErrorKind.EGRESS_DENIED, refusal)
        try:
            async with asyncio.timeout(request.timeout_ms / 1000):
                wire = wire_request(request=request)
                target = await _checked_target(wire.url, policy or EgressPolicy.from_settings())
                if target.scheme == "https" and not os.path.exists(DEFAULT_CA_BUNDLE_PATH):
                    raise OSError(f"Could not find a TLS CA certificate bundle, invalid path: {DEFAULT_CA_BUNDLE_PATH}")
                path, _, query = wire.target.partition("?")
                url = URL.build(
                    scheme=target.scheme,
                    host=f"[{target.address}]" if ":" in target.address else target.address,
                    port=target.port,
                    path=path,
                    query_string=query,
                    encoded=True,
                )
                named = parse_ip_literal(target.host) is None
                async with self._session().request(
                    wire.method,
                    url,
                    data=wire.body,
                    headers=wire.headers,
                    allow_redirects=False,
                    server_hostname=target.host if target.scheme == "https" and named else None,
                ) as response:
                    snippet, truncated, consumed = await _read_capped(response)
                    if not consumed:
                        response.close()  # the rest is never read: the connection goes
                    # One entry per name (its first spelling), in the order first seen, repeated
                    # fields joined with ", ": as perform's.
                    fields = response.headers
                    first: dict[str, str] = {}
                    for name in fields:
                        first.setdefault(name.lower(), name)
                    headers = {
                        name: ", ".join(fields.getall(name))
                        for name in itertools.islice(first.values(), settings.RESPONSE_MAX_HEADERS)
                    }
                    return response_outcome(
                        status=response.status,
                        reason=response.reason,
                        headers=headers,
                        snippet=snippet,
                        truncated=truncated,
                        secrets=secrets,
                        latency_ms=latency(),
                    )
        except EgressDenied as exc:
            return failure(ErrorKind.EGRESS_DENIED, str(exc))
        except TimeoutError:
            return failure(ErrorKind.TIMEOUT, f"no complete response within {request.timeout_ms} ms")
        except Exception as exc:
            kind, message = _describe(exc)
            return failure(kind, message)


async def _checked_target(url: str, policy: EgressPolicy) -> Target:
    """`EgressPolicy.resolve` with its lookup off the loop: a name is looked up by the
    policy's resolver (the system's unless a test gives one) on a lookup thread of its own, so
    a hung lookup holds that thread and this try (until its deadline), never the loop or
    another try's lookup; the addresses found are then checked here. A URL naming an address,
    or one the policy refuses as written, is decided at once."""
    parts = urlsplit(url)
    try:
        host = client_host(url)
        port = parts.port or default_port(parts.scheme)
    except ValueError:
        return policy.resolve(url)  # refused as malformed, before any lookup
    if not host or parse_ip_literal(host) is not None or parts.scheme not in ("http", "https"):
        return policy.resolve(url)
    loop = asyncio.get_running_loop()
    found: asyncio.Future[list[str]] = loop.create_future()
    resolver = policy.resolver or system_resolver

    def lookup() -> None:
        try:
            result: list[str] | BaseException = list(resolver(host, port))
        except BaseException as exc:  # handed to the try
            result = exc
        loop.call_soon_threadsafe(_settle, found, result)

    run_lookup(lookup)
    addresses = await found  # the try's deadline cancels the wait, never the lookup's thread
    return policy.resolve(url, lookup=lambda _host, _port: addresses)


def _settle(found: asyncio.Future[list[str]], result: list[str] | BaseException) -> None:
    if found.done():  # the try ended at its deadline meanwhile
        return
    if isinstance(result, BaseException):
        found.set_exception(result)
    else:
        found.set_result(result)


async def _read_capped(response: aiohttp.ClientResponse) -> tuple[bytes, bool, bool]:
    """Read the body up to RESPONSE_BODY_MAX_BYTES, keeping only the snippet (memory: aiohttp's
    read buffer plus the snippet, whatever the cap). Returns (snippet, truncated, read to its
    end)."""
    cap = settings.RESPONSE_BODY_MAX_BYTES
    keep = settings.RESPONSE_BODY_SNIPPET_BYTES
    snippet = bytearray()
    size = 0
    while chunk := await response.content.readany():
        if len(snippet) < keep:
            snippet += chunk[: keep - len(snippet)]
        size += len(chunk)
        if size > cap:
            return bytes(snippet), True, False
    return bytes(snippet), size > keep, True


def _describe(exc: BaseException) -> tuple[str, str]:
    """(ErrorKind, short message) for what aiohttp raised, in `describe_error`'s words."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return describe_error(exc.certificate_error)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return describe_error(exc.os_error)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return ErrorKind.NETWORK_ERROR, "connection closed before a response"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return ErrorKind.NETWORK_ERROR, "the response body ended early"
    # A response aiohttp's parser refused: the parser's error, or its message on a 400 that
    # aiohttp makes of it (no response of the server's has a status here yet).
    cause = exc.__cause__ if isinstance(exc.__cause__, http_exceptions.HttpProcessingError) else exc
    if isinstance(cause, http_exceptions.HttpProcessingError | aiohttp.ClientResponseError):
        message = str(getattr(cause, "message", "") or cause)
        if isinstance(cause, http_exceptions.LineTooLong) or message.startswith("Got more than"):
            return ErrorKind.NETWORK_ERROR, "a response header line is too long"
        if "too many headers" in message.lower():
            return ErrorKind.NETWORK_ERROR, f"the response has more than {settings.RESPONSE_MAX_HEADERS} headers"
        return ErrorKind.NETWORK_ERROR, "not an HTTP response"
    return describe_error(exc)  # OSError, TLS, a name that does not resolve, a bug


_sender = Sender()


def sender() -> Sender:
    """The process's sender."""
    return _sender
