"""What a target URL and a header must be, before anything is sent: the rules a service call's URL
and headers, a webhook subscription's URL and a connection's token URL and header share
(docs/security.md §1)."""

from __future__ import annotations

import functools
import re
from typing import Any
from urllib.parse import urlsplit

from core.text import CONTROL, INVISIBLE, first_of, hidden_class
from execution.egress import EgressPolicy, client_host, parse_ip_literal, refused_header

MAX_URL = 2048
MAX_HOST = 253
# A host name as requests sends it (after IDNA): letters, digits, '-', '_' and dots.
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_HEADER_VALUE = 8192
# RFC 9110 token characters: a header's name.
_TOKEN_CHARS = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TOKEN = re.compile(_TOKEN_CHARS + r"\Z")  # \Z, not $: "$" would let a trailing newline through
# header_name_error's and header_value_error's rules as patterns, for the OpenAPI schema: a token;
# tab, printable ASCII and Latin-1's printable characters.
HEADER_NAME_PATTERN = f"^{_TOKEN_CHARS}$"
HEADER_VALUE_PATTERN = r"^[\t\u0020-\u007e\u00a0-\u00ff]*$"


@functools.cache
def http_url_pattern() -> str:
    """url_error's rules of form as a pattern (ECMAScript's and Python's alike), for the OpenAPI
    schema: http or https, a host part with no credentials, no whitespace, control or invisible
    character, no backslash. Which hosts are valid and allowed stays the server's rule."""
    refused = rf"\s{hidden_class()}\\"
    return rf"^[Hh][Tt][Tt][Pp][Ss]?://[^{refused}/?#@]+(?:[/?#][^{refused}]*)?$"


def url_error(url: Any, *, policy: EgressPolicy | None = None) -> str | None:
    if not isinstance(url, str) or not url.strip():
        return "A URL is required."
    if len(url) > MAX_URL:
        return f"The URL is longer than {MAX_URL} characters."
    if _SURROGATE.search(url):
        return "The URL is not valid Unicode text."
    if any(ch.isspace() for ch in url) or first_of(url, INVISIBLE) is not None:
        return "The URL must not contain whitespace, control or invisible characters."
    if "\\" in url:
        # Browsers read "\" as "/", RFC 3986 parsers do not: refused rather than guessed.
        return "The URL must not contain backslashes."
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"The URL is malformed: {exc}."
    if parts.scheme not in ("http", "https"):
        return "The URL must be absolute and use http or https."
    if not parts.hostname:
        return "The URL must name a host."
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "The URL must not carry credentials (user:password@); use a header."
    if port == 0:
        return "The URL's port must be between 1 and 65535."
    try:
        host = client_host(url)
    except ValueError as exc:
        return f"The URL's host is not valid: {exc}."
    if parse_ip_literal(host) is None:
        if len(host) > MAX_HOST or not _HOST_NAME.match(host):
            return "The URL's host is not a valid host name or IP address."
    elif (refusal := (policy or EgressPolicy.from_settings()).literal_refusal(url)) is not None:
        return f"The URL is refused by the egress policy: {refusal}."
    return None


def header_name_error(name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return "Header names must be non-empty strings."
    if not _TOKEN.match(name):
        return f"Header name {name[:40]!r} is not a valid token."
    # The egress policy owns the one list (the agent's own, hop-by-hop and Proxy-* headers).
    if refused_header(name):
        return f"Header {name!r} is set by the agent and cannot be given."
    return None


def header_value_error(name: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"Header {name[:40]!r} must have a string value."
    if "\r" in value or "\n" in value or "\x00" in value:
        return f"Header {name[:40]!r} must not contain CR, LF or NUL."
    if (ch := first_of(value, CONTROL, allowed="\t")) is not None:
        return f"Header {name[:40]!r} must not contain control characters (U+{ord(ch):04X})."
    if any(ord(ch) > 255 for ch in value):
        return f"Header {name[:40]!r} must be ASCII or Latin-1 text."
    if len(value) > MAX_HEADER_VALUE:
        return f"Header {name[:40]!r} is longer than {MAX_HEADER_VALUE} characters."
    return None
