"""perform() on urllib3 directly (execution/http.py, execution/transport.py): the request on the
wire is the one requests prepared before, failures read as they did, and what was taken out of
an attempt's cost kept its bounds — one name resolution per attempt (the resend included),
lookup threads reused but never waited for, the shared deadline thread woken only for an
earlier deadline, and a small body sent with the request head in one send().

requests stays the oracle for the wire: `_prepared_by_requests` is how the attempt built its
request before (a PreparedRequest, plus the agent's Accept-Encoding and Host).
"""

from __future__ import annotations

import gzip
import socket
import threading
import time

import pytest
import requests

from execution import transport
from execution.egress import EgressPolicy, host_header
from execution.http import HttpRequest, _DeadlineWatch, perform
from execution.outcomes import ErrorKind
from execution.wire import USER_AGENT, encode_body, sent_body, sent_headers, wire_request
from tests.support.listeners import keep_alive, listening


def _prepared_by_requests(request: HttpRequest) -> requests.PreparedRequest:
    body, headers = encode_body(request.body, dict(request.headers))
    prepared = requests.PreparedRequest()
    prepared.prepare(
        method=request.method,
        url=request.url,
        headers={"User-Agent": USER_AGENT, **headers, **request.agent_headers},
        data=body,
    )
    prepared.headers.setdefault("Accept-Encoding", "identity")
    prepared.headers["Host"] = host_header(url=prepared.url or "")
    return prepared


def _request(method="GET", url="http://127.0.0.1:8080/", headers=None, body=None, agent=None) -> HttpRequest:
    return HttpRequest(method, url, headers or {}, body, 3000, agent_headers=agent or {})


AGENT = {"X-Service-Call-Id": "0190c0de-0000-7000-8000-000000000001", "X-Service-Call-Attempt": "2"}

WIRE_CASES = {
    "get": _request(),
    "post-json": _request("POST", headers={"Authorization": "Bearer t-1", "X-Trace": "t"}, body={"a": [1, 2]}),
    "post-agent-headers": _request("POST", body={"n": 1}, agent=AGENT),
    "put-text-own-headers": _request(
        "PUT",
        headers={"Content-Type": "text/plain", "user-agent": "caller/2", "accept-encoding": "gzip"},
        body="plain text",
    ),
    "delete-no-body": _request("DELETE", headers={"X-Api-Key": "k"}),
    "patch-merge": _request("PATCH", headers={"content-type": "application/merge-patch+json"}, body={"a": None}),
    "post-empty-string": _request("POST", body=""),
    "get-empty-string": _request("GET", body=""),
    "get-string-body": _request("GET", body="x"),
    "head": _request("HEAD"),
    "lower-case-method": _request("post", body={"n": 1}),
    "query-and-fragment": _request(url="http://127.0.0.1:8080/a/b?x=1&y=%20z#frag"),
    "no-path": _request(url="http://api.example.test"),
    "space-in-path": _request(url="http://api.example.test/a b/ü?q=ä"),
    "idna-host": _request(url="http://Bücher.example/x"),
    "percent-encoded-host": _request(url="http://%31%32%37.0.0.1:9/"),
    "https-default-port": _request(url="https://api.example.test:443/"),
    "http-other-port": _request(url="http://api.example.test:443/"),
    "ipv6": _request(url="http://[::1]:8080/v6"),
    "url-credentials": _request(url="http://user:pa%40ss@api.example.test/", headers={"Authorization": "Bearer x"}),
    "url-user-only": _request(url="http://user@api.example.test/"),
    "same-name-twice": _request(headers={"x-trace": "1", "X-Trace": "2", "Cookie": "a=b"}),
    "unicode-json": _request("POST", body={"name": "é", "emoji": "😀"}),
    "agent-header-spelling": _request(headers={"x-service-call-id": "caller"}, agent=AGENT),
}


@pytest.mark.parametrize("request_", WIRE_CASES.values(), ids=WIRE_CASES.keys())
def test_the_wire_is_what_requests_prepared(request_):
    wire = wire_request(request=request_)
    old = _prepared_by_requests(request_)
    assert list(wire.headers.items()) == list(old.headers.items())  # names, spelling, order
    assert (wire.method, wire.url, wire.target, wire.body) == (old.method, old.url, old.path_url, old.body)
    assert wire.chunked == (not (old.body is None or "Content-Length" in old.headers))
    assert sent_headers(request=request_) == dict(old.headers)
    assert sent_body(request=request_) == old.body


@pytest.mark.parametrize(
    "request_",
    [
        _request(url="http://*.example.com/"),
        _request(url="api.example.test/path"),
        _request(url="http://１２７.０.０.１/"),
        _request(headers={"X-Bad": "a\nb"}),
        _request(headers={"X-Bad": " leading"}),
        _request(agent={"X-Service-Call-Attempt": 2}),  # not a string
    ],
    ids=["wildcard-host", "no-scheme", "full-width-digits", "newline-value", "leading-space", "int-value"],
)
def test_a_request_that_cannot_be_sent_raises_what_requests_raised(request_):
    with pytest.raises(ValueError) as new:
        wire_request(request=request_)
    with pytest.raises(ValueError) as old:
        _prepared_by_requests(request_)
    assert (type(new.value), str(new.value)) == (type(old.value), str(old.value))
    assert sent_headers(request=request_) == encode_body(request_.body, dict(request_.headers))[1]
    assert sent_body(request=request_) == encode_body(request_.body, dict(request_.headers))[0]


def test_sent_headers_and_the_attempt_share_one_encoding_of_the_request(http_target):
    request = _request("POST", url=http_target.url("/echo"), headers={"X-Trace": "t-1"}, body={"a": [1, 2]})
    logged = sent_headers(request=request)
    assert perform(request).succeeded
    received = http_target.requests[-1]
    assert {k.lower(): v for k, v in received["headers"].items()} == {k.lower(): v for k, v in logged.items()}
    assert received["body"] == '{"a":[1,2]}'
    assert wire_request(request=request) == request.__dict__["_wire"]  # made once, kept with the request


# --- Failures read as they did ----------------------------------------------------------------


def _answer(raw: bytes):
    def behaviour(conn: socket.socket, head: bytes, listener) -> None:
        conn.sendall(raw)

    return behaviour


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",
            (ErrorKind.NETWORK_ERROR, "the response body ended early"),
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n10\r\nhel",
            (ErrorKind.NETWORK_ERROR, "the response body ended early"),
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n",
            (ErrorKind.NETWORK_ERROR, "the response body ended early"),
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 20\r\n\r\nthis is not gzip....",
            (ErrorKind.NETWORK_ERROR, "the response body could not be decompressed"),
        ),
        (
            # urllib3 refuses conflicting lengths with its InvalidHeader, which requests (and
            # so describe_error) always read as a request header's fault.
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
            (ErrorKind.INTERNAL_ERROR, "a request header is not valid"),
        ),
        (b"HTTP/1.1 418 I'm a teapot\r\nContent-Length: 2\r\n\r\nno", (ErrorKind.HTTP_ERROR, "HTTP 418 I'm a teapot")),
        (b"HTTP/1.1 204 No Content\r\n\r\n", (None, None)),
        (b"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n", (ErrorKind.HTTP_ERROR, "HTTP 302 Found")),
    ],
    ids=["short-body", "short-chunk", "bad-chunk-size", "bad-gzip", "two-lengths", "teapot", "no-content", "redirect"],
)
def test_a_response_reads_as_it_did(raw, expected):
    with listening("127.0.0.1", _answer(raw)) as server:
        outcome = perform(_request(url=server.url("/")))
    assert (outcome.error_kind, outcome.error_message) == expected


def test_a_gzip_body_is_inflated_and_repeated_headers_are_joined():
    body = gzip.compress(b'{"zipped":true}')
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nX-Multi: a\r\nx-multi: b\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    with listening("127.0.0.1", _answer(raw)) as server:
        outcome = perform(_request(url=server.url("/")))
    assert outcome.succeeded and outcome.body_snippet == '{"zipped":true}'
    assert outcome.headers["X-Multi"] == "a, b"
    assert "x-multi" not in outcome.headers


def test_a_request_header_that_cannot_be_sent_is_an_internal_error_and_sends_nothing():
    with listening("127.0.0.1", _answer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) as server:
        outcome = perform(_request(url=server.url("/"), headers={"X-Bad": "a\r\nInjected: 1"}))
    assert (outcome.error_kind, outcome.error_message) == (ErrorKind.INTERNAL_ERROR, "a request header is not valid")
    assert server.connections == 0


def test_a_url_without_a_scheme_says_what_requests_said():
    outcome = perform(_request(url="api.example.test/x"))
    assert outcome.error_kind == ErrorKind.NETWORK_ERROR
    assert outcome.error_message.startswith("Invalid URL 'api.example.test/x': No scheme supplied")


# --- One resolution per attempt, the resend included ---------------------------------------------


def test_a_get_sent_again_goes_to_the_address_checked_for_its_attempt():
    """The resend of a request the server dropped on a kept-alive connection (may_send_again)
    is part of the same attempt: it uses the address resolved and checked for it, and does
    not resolve the name again."""
    lookups: list[str] = []
    policy = EgressPolicy.from_settings()
    policy.resolver = lambda host, port: lookups.append(host) or ["127.0.0.1"]
    with listening("127.0.0.1", keep_alive(drop_after_idle=0)) as server:
        first = perform(_request(url=f"http://kept.example.test:{server.port}/first"), policy=policy)
        second = perform(_request(url=f"http://kept.example.test:{server.port}/second"), policy=policy)
    assert first.succeeded and second.succeeded, second
    assert (server.connections, server.dropped) == (2, 1)
    assert server.request_lines()[-2:] == ["GET /second HTTP/1.1", "GET /second HTTP/1.1"]
    assert lookups == ["kept.example.test", "kept.example.test"]


# --- Lookup threads: reused, never waited for ---------------------------------------------------


def _lookup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "egress-resolve"]


def test_name_lookups_reuse_an_idle_thread(monkeypatch):
    # A pool of its own: idle threads other tests left would take the lookups in turn.
    monkeypatch.setattr(transport, "_lookup_threads", transport._LookupThreads())
    resolved_on: list[int] = []

    def resolver(host, port):
        resolved_on.append(threading.get_ident())
        return ["127.0.0.1"]

    policy = EgressPolicy.from_settings()
    policy.resolver = resolver
    with listening("127.0.0.1", keep_alive(drop_after_idle=5)) as server:
        url = f"http://reuse.example.test:{server.port}/"
        outcomes = [perform(_request(url=url), policy=policy) for _ in range(10)]
    assert all(o.succeeded for o in outcomes)
    assert len(resolved_on) == 10
    # One after another, the ten lookups ran on one thread (a thread per lookup would show ten),
    # and never on the caller's.
    assert len(set(resolved_on)) == 1, resolved_on
    assert threading.get_ident() not in resolved_on


def test_a_hung_lookup_holds_its_thread_but_never_delays_the_next_attempt():
    hung = threading.Event()
    slow = EgressPolicy.from_settings()
    slow.resolver = lambda host, port: hung.wait(5) and ["127.0.0.1"]
    fast = EgressPolicy.from_settings()
    fast.resolver = lambda host, port: ["127.0.0.1"]
    try:
        with listening("127.0.0.1", keep_alive(drop_after_idle=5)) as server:
            timed_out = perform(_request(url=f"http://hung.example.test:{server.port}/"), policy=slow)
            started = time.monotonic()
            answered = perform(_request(url=f"http://fast.example.test:{server.port}/"), policy=fast)
            elapsed = time.monotonic() - started
    finally:
        hung.set()
    assert timed_out.error_kind == ErrorKind.TIMEOUT
    assert answered.succeeded and elapsed < 1


def test_a_lookup_thread_ends_after_idling(monkeypatch):
    threads = transport._LookupThreads()
    monkeypatch.setattr(transport._LookupThreads, "IDLE_SECONDS", 0.1)
    done = threading.Event()
    threads.run(done.set)
    assert done.wait(2)
    deadline = time.monotonic() + 3
    while threads._idle and time.monotonic() < deadline:
        time.sleep(0.02)
    assert threads._idle == 0
    again = threading.Event()
    threads.run(again.set)  # a new thread, since none is idle
    assert again.wait(2)


# --- The deadline thread --------------------------------------------------------------------------


def test_deadlines_fire_on_time_whatever_order_they_are_armed_in():
    watch = _DeadlineWatch()
    fired: dict[str, float] = {}
    start = time.monotonic()

    def note(name: str):
        return lambda: fired.setdefault(name, time.monotonic() - start)

    watch.arm(start + 5, note("late"))  # the thread sleeps towards this one
    watch.arm(start + 0.2, note("earlier"))  # wakes it
    watch.arm(start + 0.4, note("later"))  # does not need to
    cancelled = watch.arm(start + 0.3, note("cancelled"))
    watch.cancel(cancelled)
    time.sleep(0.7)
    assert set(fired) == {"earlier", "later"}
    assert 0.2 <= fired["earlier"] < 0.35
    assert 0.4 <= fired["later"] < 0.55


def test_cancelled_deadlines_do_not_pile_up():
    watch = _DeadlineWatch()
    far = time.monotonic() + 3600
    live = [watch.arm(far + i, lambda: None) for i in range(10)]
    for i in range(10_000):
        watch.cancel(watch.arm(far + 10 + i, lambda: None))
    assert len(watch._heap) <= 64 + 2 * len(live)
    for handle in live:
        watch.cancel(handle)


# --- A small body goes with the head, in one send() -------------------------------------------------


class _RecordingSocket:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, data) -> int:
        self.sent.append(bytes(data))
        return len(data)

    def settimeout(self, timeout) -> None:
        pass


def _sends(body: bytes | None, headers: dict[str, str]) -> tuple[list[bytes], int]:
    conn = transport._TrackedHTTPConnection("127.0.0.1", 9)
    conn.sock = _RecordingSocket()  # type: ignore[assignment]
    transport.begin_attempt(policy=None, deadline=None)
    try:
        conn.request("POST", "/x", body=body, headers=headers)
        return conn.sock.sent, transport.last_progress().request_bytes  # type: ignore[union-attr]
    finally:
        transport.end_attempt()


@pytest.mark.parametrize("size", [1, 1000, transport.COALESCED_BODY_MAX_BYTES, transport.COALESCED_BODY_MAX_BYTES + 1])
def test_a_body_up_to_the_limit_goes_out_with_the_head_and_the_bytes_are_the_same(size):
    body = b"b" * size
    headers = {"Host": "example.test", "Content-Length": str(size)}
    sends, counted = _sends(body, headers)
    assert len(sends) == (1 if size <= transport.COALESCED_BODY_MAX_BYTES else 2)
    wire = b"".join(sends)
    assert wire.endswith(b"\r\n\r\n" + body)
    assert counted == len(wire)
    # What urllib3 itself sends: the same bytes, in two sends.
    plain = transport._TrackedHTTPConnection("127.0.0.1", 9)
    plain.sock = _RecordingSocket()  # type: ignore[assignment]
    super(transport._TrackedConnectionMixin, plain).request("POST", "/x", body=body, headers=headers)  # type: ignore[misc]
    assert b"".join(plain.sock.sent) == wire  # type: ignore[union-attr]


def test_a_body_without_content_length_is_left_to_urllib3():
    sends, _ = _sends(b"abc", {"Host": "example.test"})
    assert len(sends) == 2
    assert b"Content-Length: 3\r\n" in sends[0] and sends[1] == b"abc"


def test_bodies_around_the_limit_arrive_whole(http_target):
    for size in (1, transport.COALESCED_BODY_MAX_BYTES, transport.COALESCED_BODY_MAX_BYTES + 1, 200_000):
        text = "p" * size
        outcome = perform(_request("POST", url=http_target.url("/echo"), body=text))
        assert outcome.succeeded
        assert http_target.requests[-1]["body"] == text
