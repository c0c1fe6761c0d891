"""What an attempt tells, in words fit to store and show: the outcome of a response (2xx or an
HTTP error), the refusal of a request before anything is sent, a failure in short human words
(describe_error), with every secret header value a target may echo scrubbed out. Shared by
`execution.http.perform` and the asyncio sender (`execution.aio`)."""

from __future__ import annotations

import base64
import binascii
import errno
import http.client
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import requests
import urllib3.exceptions
from django.conf import settings

from core.secrets import REDACTED, redact_headers, secret_header_name
from execution.egress import EgressDenied, refused_header
from execution.outcomes import ErrorKind, Outcome
from execution.transport import (
    ResponseHeadersTooLarge,
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


# --- Short, human error messages ----------------------------------------------------------


def error_chain(exc: BaseException) -> Iterator[BaseException]:
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
    causes = list(error_chain(exc))
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
