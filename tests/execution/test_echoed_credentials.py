"""perform(): a target that quotes only part of a secret header — the credential after the
auth scheme, one cookie's value, a Basic password — does not get it into the outcome
(snippet, headers, error message). docs/security.md §4."""

from __future__ import annotations

import base64
import socket
from collections.abc import Callable

from execution.http import HttpRequest, perform
from execution.outcomes import ErrorKind
from tests.support.listeners import Behaviour, Listener, listening, parse_head

TOKEN = "S3cretTok3nValue"
SESSION = "Sess10nValue77"
PASSWORD = "pa55word-xyz"


def quoting(pick: Callable[[dict[str, str]], str]) -> Behaviour:
    """A listener behaviour answering 401 with `pick(request headers)` alone in the reason
    phrase, a response header and the body, as an API quoting the credential it refused does."""

    def behaviour(conn: socket.socket, head: bytes, listener: Listener) -> None:
        _, headers = parse_head(head)
        quoted = pick({name.lower(): value for name, value in headers.items()})
        body = f"invalid credential {quoted}".encode("latin-1")
        lines = [
            f"HTTP/1.1 401 Bad credential {quoted}",
            f"Content-Length: {len(body)}",
            "Connection: close",
            f"X-Rejected: {quoted}",
        ]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    return behaviour


def _send(server: Listener, headers: dict[str, str]):
    return perform(HttpRequest(method="GET", url=server.url(), headers=headers, body=None, timeout_ms=3000))


def _assert_scrubbed(outcome, secret: str) -> None:
    assert (outcome.error_kind, outcome.status) == (ErrorKind.HTTP_ERROR, 401)
    assert secret not in repr(outcome)
    assert outcome.body_snippet == "invalid credential ***"
    assert outcome.headers["X-Rejected"] == "***"
    assert outcome.error_message == "HTTP 401 Bad credential ***"


def test_a_bearer_token_quoted_without_its_scheme_is_scrubbed():
    with listening("127.0.0.1", quoting(lambda h: h["authorization"].split(None, 1)[1])) as server:
        outcome = _send(server, {"Authorization": f"Bearer {TOKEN}"})
    assert server.headers_received()[0]["Authorization"] == f"Bearer {TOKEN}"  # sent as given
    _assert_scrubbed(outcome, TOKEN)


def test_a_credential_after_a_scheme_in_any_secret_header_is_scrubbed():
    with listening("127.0.0.1", quoting(lambda h: h["x-auth-token"].split(None, 1)[1])) as server:
        outcome = _send(server, {"X-Auth-Token": f"Token\t{TOKEN}"})  # secret by its name; a tab
    _assert_scrubbed(outcome, TOKEN)


def test_one_cookies_value_quoted_alone_is_scrubbed():
    def session_value(h: dict[str, str]) -> str:
        return dict(pair.strip().split("=", 1) for pair in h["cookie"].split(";"))["session"]

    with listening("127.0.0.1", quoting(session_value)) as server:
        outcome = _send(server, {"Cookie": f"theme=dark-mode; session={SESSION}"})
    _assert_scrubbed(outcome, SESSION)


def test_a_basic_password_quoted_decoded_is_scrubbed():
    credential = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()

    def password(h: dict[str, str]) -> str:
        return base64.b64decode(h["authorization"].split()[1]).decode().split(":", 1)[1]

    with listening("127.0.0.1", quoting(password)) as server:
        outcome = _send(server, {"Authorization": f"Basic {credential}"})
    _assert_scrubbed(outcome, PASSWORD)


def test_cookie_values_shorter_than_four_characters_are_left_alone():
    # Scrubbing "ok" everywhere would wreck the snippet for nothing worth hiding.
    with listening("127.0.0.1", quoting(lambda h: "ok")) as server:
        outcome = _send(server, {"Cookie": "a=ok"})
    assert outcome.body_snippet == "invalid credential ok"
