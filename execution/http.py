"""One HTTP attempt with `requests`: no redirects, no proxies, bounded in time and size.

Never call this inside a database transaction (SPEC §3 rule 7); `perform` checks.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings
from django.db import connection

from execution.egress import (
    EgressDenied,
    EgressPolicy,
    PinnedAdapter,
    track_sockets,
    use_policy,
)
from execution.outcomes import ErrorKind, Outcome


@dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    headers: dict[str, str]
    body: Any
    timeout_ms: int


class _DeadlineExceeded(Exception):
    pass


_local = threading.local()


def _session() -> requests.Session:
    session = getattr(_local, "session", None)
    if session is None:
        session = requests.Session()
        session.trust_env = False  # proxy variables and .netrc are ignored
        session.max_redirects = 0
        adapter = PinnedAdapter(pool_connections=8, pool_maxsize=8, max_retries=0)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        # requests adds these on its own; the caller's headers are the whole request.
        session.headers.clear()
        session.headers["User-Agent"] = "ServiceAgent/1.0"
        _local.session = session
    return session


def encode_body(body: Any, headers: dict[str, str]) -> tuple[bytes | None, dict[str, str]]:
    """Strings go as they are; any other JSON value as JSON, with a content type if none."""
    if body is None:
        return None, headers
    if isinstance(body, str):
        return body.encode(), headers
    if not any(name.lower() == "content-type" for name in headers):
        headers = {**headers, "Content-Type": "application/json"}
    return json.dumps(body, separators=(",", ":")).encode(), headers


def perform(request: HttpRequest, *, policy: EgressPolicy | None = None) -> Outcome:
    """Send the request once and describe what happened. Never raises."""
    if connection.in_atomic_block:
        raise RuntimeError("no HTTP request inside a database transaction (SPEC §3 rule 7)")
    started = time.monotonic()
    timeout_s = request.timeout_ms / 1000
    deadline = started + timeout_s

    def latency() -> int:
        return int((time.monotonic() - started) * 1000)

    def timed_out() -> Outcome:
        return Outcome.failure(
            ErrorKind.TIMEOUT, f"no complete response within {request.timeout_ms} ms", latency_ms=latency()
        )

    data, headers = encode_body(request.body, dict(request.headers))
    use_policy(policy)
    sockets = track_sockets()
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

    timer = threading.Timer(timeout_s, on_deadline)
    timer.daemon = True
    timer.start()
    response = None
    try:
        response = _session().request(
            request.method, request.url, headers=headers, data=data,
            timeout=(timeout_s, timeout_s), allow_redirects=False, stream=True,
        )
        if len(response.raw.headers) > settings.RESPONSE_MAX_HEADERS:
            return Outcome.failure(
                ErrorKind.NETWORK_ERROR,
                f"the response has more than {settings.RESPONSE_MAX_HEADERS} headers",
                status=response.status_code, latency_ms=latency(),
            )
        body, truncated = _read_capped(response, deadline, expired)
    except EgressDenied as exc:
        return Outcome.failure(ErrorKind.EGRESS_DENIED, str(exc), latency_ms=latency())
    except (_DeadlineExceeded, requests.exceptions.Timeout):
        return timed_out()
    except requests.exceptions.SSLError as exc:
        return Outcome.failure(ErrorKind.TLS_ERROR, _short(exc), latency_ms=latency())
    except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError,
            requests.exceptions.ContentDecodingError, OSError) as exc:
        if expired.is_set():
            return timed_out()
        return Outcome.failure(ErrorKind.NETWORK_ERROR, _short(exc), latency_ms=latency())
    except Exception as exc:  # a bug or an exotic failure: typed, never lost
        return Outcome.failure(
            ErrorKind.INTERNAL_ERROR, f"{type(exc).__name__}: {_short(exc)}", latency_ms=latency()
        )
    finally:
        timer.cancel()
        if response is not None:
            response.close()
        sockets.clear()
        use_policy(None)

    snippet_bytes = settings.RESPONSE_BODY_SNIPPET_BYTES
    snippet = body[:snippet_bytes].decode("utf-8", errors="replace")
    truncated = truncated or len(body) > snippet_bytes
    headers_out = dict(list(response.headers.items())[: settings.RESPONSE_MAX_HEADERS])
    status = response.status_code
    if 200 <= status < 300:
        return Outcome(
            succeeded=True, status=status, headers=headers_out, body_snippet=snippet,
            body_truncated=truncated, latency_ms=latency(),
        )
    return Outcome(
        succeeded=False, status=status, headers=headers_out, body_snippet=snippet,
        body_truncated=truncated, latency_ms=latency(), error_kind=ErrorKind.HTTP_ERROR,
        error_message=f"HTTP {status} {response.reason or ''}".strip(),
    )


def _read_capped(response: requests.Response, deadline: float, expired: threading.Event) -> tuple[bytes, bool]:
    """Read the body after decompression up to the cap, within the whole-attempt deadline."""
    cap = settings.RESPONSE_BODY_MAX_BYTES
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(chunk_size=16384):
        if expired.is_set() or time.monotonic() > deadline:
            raise _DeadlineExceeded
        chunks.append(chunk)
        size += len(chunk)
        if size >= cap:
            return b"".join(chunks)[:cap], True
    if expired.is_set():
        raise _DeadlineExceeded
    return b"".join(chunks), False


def _short(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__)[:500]
