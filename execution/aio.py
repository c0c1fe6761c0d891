"""Many HTTP requests at once on one asyncio loop: how webhooks go out (delivery/runner.py).

`perform` (execution/http.py) holds a thread for each request, and around urllib3 it keeps a
deadline timer and the wire bookkeeping that lets it send an idempotent request once more. In a
burst, event delivery spent half the workers' CPU in that path and in handing each try to a
thread of its own (bench/README.md, item 17). Here one loop, in a daemon thread of the process,
sends every request with aiohttp: a caller hands requests over with a callback and never waits.

The same request and the same rules as `perform` (docs/security.md §3):
- `wire_request` makes the request, so the same headers go out, and aiohttp adds none of its
  own;
- the egress policy resolves the URL's host and checks every address before anything
  connects, and the connection goes to the checked address: the URL handed to aiohttp names
  the address, the Host header and TLS's server name the URL's host, and its pool is keyed by
  both;
- no redirects, no proxy and no .netrc (`trust_env` off), no cookies (a jar that keeps none),
  no decompression (the request asks for `identity`; a snippet is kept as it came);
- at most RESPONSE_MAX_HEADERS headers, each line at most HEADER_LINE_MAX_BYTES (aiohttp
  bounds lines, not the header block as `perform` does: RESPONSE_MAX_HEADER_BYTES caps the
  line too when it is lower), and at most RESPONSE_BODY_MAX_BYTES of body read, of which only
  the snippet is kept;
- one deadline for the whole request: resolution, connect, headers and body;
- a kept-alive connection idle for POOLED_CONNECTION_MAX_IDLE_SECONDS is closed, not reused.
What `perform` does and this does not: it never sends a request a second time. A try that a
closing kept-alive connection cut short fails, and the delivery schedule tries it again.
"""

from __future__ import annotations

import asyncio
import atexit
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
from requests.utils import DEFAULT_CA_BUNDLE_PATH
from yarl import URL

from execution.egress import EgressDenied, EgressPolicy, Target, client_host, parse_ip_literal, refused_header
from execution.http import HttpRequest, describe_error, response_outcome, scrub, secret_values, wire_request
from execution.outcomes import ErrorKind, Outcome
from execution.transport import POOLED_CONNECTION_MAX_IDLE_SECONDS

logger = logging.getLogger(__name__)

Done = Callable[[Outcome], None]

# Connections kept per checked address (and TLS server name): as many requests to one receiver
# run at once as the caller lets out (delivery: DELIVERY_PER_SUBSCRIPTION), these many share
# kept-alive connections, the rest wait for one.
CONNECTIONS_PER_TARGET = 64

# aiohttp's default, and the common servers' (nginx's large_client_header_buffers, Apache's
# LimitRequestFieldSize): with RESPONSE_MAX_HEADERS of them, what a response's headers may hold.
HEADER_LINE_MAX_BYTES = 8190


class Sender:
    """One asyncio loop in a daemon thread with one aiohttp session, started on first use in
    the process that uses it (a forked worker starts its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        # Written only on the loop's thread: a session per set of header bounds (settings a test
        # may change), each with its own connections.
        self._sessions: dict[tuple[int, int], aiohttp.ClientSession] = {}
        self._tls: ssl.SSLContext | None = None

    def submit(self, requests: Sequence[tuple[HttpRequest, Done]], *, policy: EgressPolicy | None = None) -> None:
        """Send each request and call its `done` with the Outcome, on the loop's thread (so
        `done` must not block); never raises for a request's failure, which is its Outcome."""
        if requests:
            self._running_loop().call_soon_threadsafe(self._start, list(requests), policy)

    def perform_many(self, requests: Sequence[HttpRequest], *, policy: EgressPolicy | None = None) -> list[Outcome]:
        """Send the requests at once and wait for every Outcome (from a plain thread)."""
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
            finished.wait()
        return outcomes  # type: ignore[return-value]  # every index is set before `finished`

    # On the loop's thread.

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="http-sender", daemon=True).start()
                self._loop, self._pid, self._sessions = loop, os.getpid(), {}
                atexit.register(self._close, loop)
            return self._loop

    def _close(self, loop: asyncio.AbstractEventLoop) -> None:
        """At exit: the sessions' connections closed (quietly, within a second)."""
        if self._loop is not loop or self._pid != os.getpid():
            return

        async def close() -> None:
            for session in list(self._sessions.values()):
                await session.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), loop).result(1)
        except Exception:  # exiting anyway
            pass

    def _start(self, requests: list[tuple[HttpRequest, Done]], policy: EgressPolicy | None) -> None:
        for request, done in requests:
            task = asyncio.ensure_future(self._perform(request, policy))
            task.add_done_callback(lambda finished, done=done: _report(finished, done))

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

        refused = [name for name in request.headers if refused_header(name)]
        if refused:
            return failure(ErrorKind.EGRESS_DENIED, f"the header {refused[0]!r} is set by the agent and refused")
        try:
            async with asyncio.timeout(request.timeout_ms / 1000):
                wire = wire_request(request=request)
                target = await _checked_target(wire.url, policy or EgressPolicy.from_settings())
                if target.scheme == "https" and not os.path.exists(DEFAULT_CA_BUNDLE_PATH):
                    raise OSError(f"Could not find a TLS CA certificate bundle, invalid path: {DEFAULT_CA_BUNDLE_PATH}")
                path, _, query = wire.target.partition("?")
                url = URL.build(
                    scheme=target.scheme,
                    host=target.address,
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
                    fields = response.headers
                    headers = {
                        name: ", ".join(fields.getall(name))
                        for name in itertools.islice(dict.fromkeys(fields.keys()), settings.RESPONSE_MAX_HEADERS)
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
    """`EgressPolicy.resolve` off the loop when the host is a name (a lookup blocks); an address
    written in the URL is checked at once."""
    parts = urlsplit(url)
    try:
        literal = parse_ip_literal(client_host(url)) is not None
    except ValueError:
        literal = True  # resolve() refuses it without a lookup
    if literal or parts.scheme not in ("http", "https"):
        return policy.resolve(url)
    return await asyncio.get_running_loop().run_in_executor(None, policy.resolve, url)


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


def _report(task: asyncio.Future[Outcome], done: Done) -> None:
    try:
        outcome = task.result()
    except BaseException as exc:  # a bug, or the loop cancelling it: a failed request, not a lost one
        outcome = Outcome.failure(ErrorKind.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"[:1000])
    try:
        done(outcome)
    except Exception:
        logger.exception("the callback of a request failed")


_sender = Sender()


def sender() -> Sender:
    """The process's sender."""
    return _sender
