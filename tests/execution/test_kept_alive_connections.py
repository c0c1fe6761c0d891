"""Kept-alive connections: reused while fresh, never raced against the server's idle close.

A server closes an idle kept-alive connection when its timer fires (gunicorn: 2 s); a request
sent on it at that moment is lost before the target sees it. The agent does not reuse a
connection idle longer than POOLED_CONNECTION_MAX_IDLE_SECONDS, and sends a request once more,
on a new connection, only when it provably did not reach the target (docs/security.md §3).
Servers are raw sockets on 127.0.0.1 (tests/support/listeners.py `keep_alive`).
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from execution.http import HttpRequest, perform
from execution.outcomes import ErrorKind
from execution.transport import POOLED_CONNECTION_MAX_IDLE_SECONDS, WireProgress, may_send_again
from tests.support.listeners import Listener, keep_alive, listening, read_head

CLOSED = {"connection closed before a response", "connection reset"}


def call(url: str, *, method: str = "GET", body=None, timeout_ms: int = 3000) -> HttpRequest:
    return HttpRequest(method=method, url=url, headers={}, body=body, timeout_ms=timeout_ms)


def test_a_connection_idle_for_less_than_the_limit_is_reused():
    with listening("127.0.0.1", keep_alive(drop_after_idle=5)) as server:
        outcomes = [perform(call(server.url(f"/{n}"), method="POST", body={"n": n})) for n in range(3)]
    assert [o.succeeded for o in outcomes] == [True, True, True]
    assert (server.connections, server.dropped) == (1, 0)


def test_a_connection_idle_for_longer_than_the_limit_is_not_reused():
    """Two POSTs 1.7 s apart to a server that drops a request after 1.5 s idle: reusing the
    connection would lose the second one (and a POST is never sent again)."""
    assert POOLED_CONNECTION_MAX_IDLE_SECONDS < 1.5
    with listening("127.0.0.1", keep_alive(drop_after_idle=1.5)) as server:
        first = perform(call(server.url("/first"), method="POST", body={"n": 1}))
        time.sleep(1.7)
        second = perform(call(server.url("/second"), method="POST", body={"n": 2}))
    assert first.succeeded and second.succeeded, second
    assert (server.connections, server.dropped) == (2, 0)


def test_a_get_the_server_dropped_on_a_reused_connection_goes_again_on_a_new_one():
    with listening("127.0.0.1", keep_alive(drop_after_idle=0)) as server:
        first = perform(call(server.url("/first")))
        second = perform(call(server.url("/second")))
    assert first.succeeded and second.succeeded, second
    assert (server.connections, server.dropped) == (2, 1)
    assert server.request_lines() == ["GET /first HTTP/1.1", "GET /second HTTP/1.1", "GET /second HTTP/1.1"]


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_request_that_is_not_idempotent_is_not_sent_again(method):
    with listening("127.0.0.1", keep_alive(drop_after_idle=0)) as server:
        first = perform(call(server.url("/first"), method=method, body={"n": 1}))
        second = perform(call(server.url("/second"), method=method, body={"n": 2}))
    assert first.succeeded
    assert second.error_kind == ErrorKind.NETWORK_ERROR and second.error_message in CLOSED, second
    assert (server.connections, server.dropped) == (1, 1)
    assert server.request_lines() == [f"{method} /first HTTP/1.1", f"{method} /second HTTP/1.1"]


def test_a_read_timeout_on_a_reused_connection_is_not_sent_again():
    """The target may be working on it: a timeout is the attempt's end, whatever the method."""

    def answer_once_then_hang(conn, head, listener: Listener) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        second = read_head(conn)
        with listener.lock:
            listener.received.append(second)
        listener.stopped.wait(5)

    with listening("127.0.0.1", answer_once_then_hang) as server:
        first = perform(call(server.url("/first")))
        second = perform(call(server.url("/second"), timeout_ms=500))
    assert first.succeeded
    assert second.error_kind == ErrorKind.TIMEOUT
    assert (server.connections, len(server.received)) == (1, 2)


def test_a_get_whose_response_had_begun_is_not_sent_again():
    """One byte of an answer proves the target saw the request."""

    def answer_once_then_break_off(conn, head, listener: Listener) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        second = read_head(conn)
        with listener.lock:
            listener.received.append(second)
        conn.sendall(b"H")
        time.sleep(0.2)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset

    with listening("127.0.0.1", answer_once_then_break_off) as server:
        first = perform(call(server.url("/first")))
        second = perform(call(server.url("/second")))
    assert first.succeeded
    assert (second.error_kind, second.error_message) == (ErrorKind.NETWORK_ERROR, "connection reset")
    assert (server.connections, len(server.received)) == (1, 2)


@pytest.mark.parametrize(
    ("method", "progress", "peer_closed", "expected"),
    [
        # Not one byte written on a reused connection: the target cannot have seen it.
        ("POST", WireProgress(reused=True, request_bytes=0), True, True),
        ("PATCH", WireProgress(reused=True, request_bytes=0), True, True),
        ("GET", WireProgress(reused=True, request_bytes=0), True, True),
        # Written, then closed before any response byte: idempotent methods only.
        ("GET", WireProgress(reused=True, request_bytes=120), True, True),
        ("get", WireProgress(reused=True, request_bytes=120), True, True),
        ("HEAD", WireProgress(reused=True, request_bytes=120), True, True),
        ("PUT", WireProgress(reused=True, request_bytes=120), True, True),
        ("DELETE", WireProgress(reused=True, request_bytes=120), True, True),
        ("OPTIONS", WireProgress(reused=True, request_bytes=120), True, True),
        ("POST", WireProgress(reused=True, request_bytes=120), True, False),
        ("PATCH", WireProgress(reused=True, request_bytes=1), True, False),
        # A response had begun: the target saw the request.
        ("GET", WireProgress(reused=True, request_bytes=120, response_started=True), True, False),
        ("POST", WireProgress(reused=True, request_bytes=0, response_started=True), True, False),
        # A new connection: its failure is the target's answer, not a stale pool's.
        ("GET", WireProgress(reused=False, request_bytes=0), True, False),
        ("POST", WireProgress(reused=False, request_bytes=0), True, False),
        # Not closed by the peer (a timeout, TLS): never.
        ("GET", WireProgress(reused=True, request_bytes=0), False, False),
        ("GET", WireProgress(reused=True, request_bytes=120), False, False),
    ],
)
def test_may_send_again(method, progress, peer_closed, expected):
    assert may_send_again(method=method, progress=progress, peer_closed=peer_closed) is expected
