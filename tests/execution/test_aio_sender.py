"""execution/aio.py: many requests at once on one asyncio loop, under perform's rules.

Each behaviour here is asked of both transports: the asyncio sender must give the Outcome
`perform` gives (kind, message, status), so a webhook try fails and is described exactly as a
service call's attempt would be. Every server is a loopback listener (tests/support/listeners.py);
addresses outside loopback are only ever decided, never connected to.
"""

from __future__ import annotations

import threading
import time

import pytest

from execution.aio import sender
from execution.http import HttpRequest, perform
from execution.outcomes import ErrorKind
from tests.execution.test_http_perform import policy_resolving, tls_server  # noqa: F401  (a fixture)
from tests.support.listeners import (
    big_headers,
    body_drip,
    close_quietly,
    endless_body,
    free_port,
    garbage,
    header_drip,
    listening,
    many_headers,
    redirect_to,
    reset,
    respond,
    silent,
)


def get(url: str, *, headers=None, timeout_ms: int = 3000, method="GET", body=None) -> HttpRequest:
    return HttpRequest(method=method, url=url, headers=headers or {}, body=body, timeout_ms=timeout_ms)


def send(request: HttpRequest, **kwargs):
    return sender().perform_many([request], **kwargs)[0]


def both(request: HttpRequest, **kwargs):
    """(perform's Outcome, the sender's), for the same request."""
    return perform(request, **kwargs), send(request, **kwargs)


def described(outcome):
    return outcome.succeeded, outcome.status, outcome.error_kind, outcome.error_message


# --- The same Outcome as perform ------------------------------------------------------------


def test_a_2xx_response_succeeds_with_its_status_headers_and_snippet():
    with listening("127.0.0.1", respond(body=b'{"ok":true}', headers=[("X-Seen", "yes")])) as server:
        ours, theirs = both(get(server.url()))
    assert described(theirs) == described(ours) == (True, 200, None, None)
    assert theirs.body_snippet == ours.body_snippet == '{"ok":true}'
    assert theirs.headers["X-Seen"] == "yes"


def test_a_non_2xx_response_is_an_http_error_with_its_status():
    with listening("127.0.0.1", respond(status="503 Service Unavailable", headers=[("Retry-After", "7")])) as server:
        ours, theirs = both(get(server.url()))
    assert described(theirs) == described(ours) == (False, 503, ErrorKind.HTTP_ERROR, "HTTP 503 Service Unavailable")
    assert theirs.headers["Retry-After"] == "7"


def test_the_request_on_the_wire_is_perform_s_with_the_name_in_host_and_the_checked_address_connected():
    body = '{"a":1}'
    request = get("http://hooks.example.test:{port}/in?x=1", method="POST", body=body)
    with listening("127.0.0.1", respond()) as server:
        policy = policy_resolving({"hooks.example.test": ["127.0.0.1"]})
        url = request.url.format(port=server.port)
        wire = HttpRequest(
            method="POST", url=url, headers={"Content-Type": "application/json"}, body=body, timeout_ms=3000
        )
        ours, theirs = both(wire, policy=policy)
        assert ours.succeeded and theirs.succeeded
        first, second = server.received
    assert second.startswith(b"POST /in?x=1 HTTP/1.1\r\n")
    assert sorted(first.split(b"\r\n")) == sorted(second.split(b"\r\n"))  # the same headers, none added
    assert f"Host: hooks.example.test:{server.port}\r\n".encode() in second


def test_a_redirect_is_returned_not_followed():
    with (
        listening("127.0.0.1", respond()) as elsewhere,
        listening("127.0.0.1", redirect_to(elsewhere.url("/next"))) as server,
    ):
        ours, theirs = both(get(server.url("/start")))
    assert described(theirs) == described(ours)
    assert (theirs.status, theirs.headers["Location"]) == (302, elsewhere.url("/next"))
    assert elsewhere.connections == 0


@pytest.mark.parametrize(
    "behaviour, message",
    [
        (reset, "connection reset"),
        (close_quietly, "connection closed before a response"),
        (garbage, "not an HTTP response"),
    ],
    ids=["reset", "closed", "not-http"],
)
def test_a_broken_server_is_described_as_perform_describes_it(behaviour, message):
    with listening("127.0.0.1", behaviour) as server:
        ours, theirs = both(get(server.url()))
    assert described(theirs) == described(ours) == (False, None, ErrorKind.NETWORK_ERROR, message)


def test_a_closed_port_and_a_name_that_does_not_resolve():
    refused = both(get(f"http://127.0.0.1:{free_port()}/"))
    nowhere = both(get("http://nowhere.example.test/"), policy=policy_resolving({}))
    assert [described(o) for o in refused] == [(False, None, ErrorKind.NETWORK_ERROR, "connection refused")] * 2
    assert [described(o) for o in nowhere] == [(False, None, ErrorKind.NETWORK_ERROR, "name does not resolve")] * 2


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::ffff:10.0.0.1]/",
        "file:///etc/passwd",
    ],
)
def test_an_address_outside_the_allowlist_is_refused_before_any_connection(url):
    ours, theirs = both(get(url))  # decided from the literal: nothing connects
    assert described(theirs) == described(ours)
    assert theirs.error_kind == ErrorKind.EGRESS_DENIED


def test_a_name_resolving_to_a_private_address_is_refused():
    policy = policy_resolving({"rebind.example.test": ["127.0.0.1", "10.1.2.3"]})
    ours, theirs = both(get("http://rebind.example.test/"), policy=policy)
    assert described(theirs) == described(ours)
    assert theirs.error_kind == ErrorKind.EGRESS_DENIED and "10.1.2.3" in theirs.error_message


def test_agent_owned_headers_are_refused_without_sending():
    with listening("127.0.0.1", respond()) as server:
        ours, theirs = both(get(server.url(), headers={"Transfer-Encoding": "chunked"}))
    assert described(theirs) == described(ours)
    assert theirs.error_kind == ErrorKind.EGRESS_DENIED
    assert server.connections == 0


def test_secret_values_echoed_by_the_target_are_scrubbed():
    secret = "Bearer very-secret-token-42"
    echo = respond(body=b"you sent very-secret-token-42", headers=[("Set-Cookie", "s=1")])
    with listening("127.0.0.1", echo) as server:
        ours, theirs = both(get(server.url(), headers={"Authorization": secret}))
    assert theirs.body_snippet == ours.body_snippet
    assert "very-secret-token-42" not in theirs.body_snippet
    assert theirs.headers["Set-Cookie"] == ours.headers["Set-Cookie"] != "s=1"


def test_tls_verifies_the_urls_name_on_the_checked_address(tls_server):  # noqa: F811
    port, names = tls_server
    policy = policy_resolving({"secure.example.test": ["127.0.0.1"]})
    ours, theirs = both(get(f"https://secure.example.test:{port}/"), policy=policy)
    assert names == ["secure.example.test"] * 2
    assert theirs.error_kind == ours.error_kind == ErrorKind.TLS_ERROR
    assert theirs.error_message.startswith("certificate verify failed")


# --- Bounds: one deadline, counted headers, a capped body -----------------------------------


@pytest.mark.parametrize("behaviour", [header_drip(0.05), body_drip, silent], ids=["header-drip", "body-drip", "hung"])
def test_a_slow_or_hung_target_ends_in_timeout_at_the_deadline(behaviour):
    with listening("127.0.0.1", behaviour) as server:
        started = time.monotonic()
        outcome = send(get(server.url(), timeout_ms=600))
        elapsed = time.monotonic() - started
    assert (outcome.error_kind, outcome.error_message) == (ErrorKind.TIMEOUT, "no complete response within 600 ms")
    assert 0.55 <= elapsed < 1.2  # the drip sends a byte every 50 ms: a per-read timeout would never fire


def test_a_hung_resolver_ends_in_timeout_at_the_deadline():
    policy = policy_resolving({})
    policy.resolver = lambda host, port: time.sleep(2) or ["127.0.0.1"]
    started = time.monotonic()
    outcome = send(get("http://slow-dns.example.test/", timeout_ms=300), policy=policy)
    assert outcome.error_kind == ErrorKind.TIMEOUT
    assert time.monotonic() - started < 0.8


def test_a_flood_of_headers_and_a_huge_header_are_refused_quickly(settings):
    with listening("127.0.0.1", many_headers(5000)) as flood, listening("127.0.0.1", big_headers(1, 5 << 20)) as huge:
        started = time.monotonic()
        many, big = sender().perform_many([get(flood.url()), get(huge.url())])
        elapsed = time.monotonic() - started
    assert described(many) == (False, None, ErrorKind.NETWORK_ERROR, "the response has more than 100 headers")
    assert described(big) == (False, None, ErrorKind.NETWORK_ERROR, "a response header line is too long")
    assert elapsed < 1


def test_exactly_the_allowed_number_of_headers_passes(settings):
    settings.RESPONSE_MAX_HEADERS = 20
    with listening("127.0.0.1", many_headers(18)) as fits, listening("127.0.0.1", many_headers(19)) as over:
        fitting, too_many = sender().perform_many([get(fits.url()), get(over.url())])
    assert fitting.succeeded
    assert too_many.error_message == "the response has more than 20 headers"


def test_an_endless_body_is_cut_at_the_cap_without_waiting_for_its_end(settings):
    with listening("127.0.0.1", endless_body) as server:
        started = time.monotonic()
        outcome = send(get(server.url(), timeout_ms=5000))
    assert outcome.succeeded and outcome.body_truncated
    assert outcome.body_snippet == "x" * settings.RESPONSE_BODY_SNIPPET_BYTES
    assert time.monotonic() - started < 2


# --- Many at once, none waiting for another -------------------------------------------------


def test_requests_handed_over_together_are_all_out_at_once_and_each_done_once():
    """The server answers none until all 24 are in: sent one after another, they could not
    be (the barrier breaks after 5 s and every request fails)."""
    count = 24
    barrier = threading.Barrier(count, timeout=5)

    def together(conn, head, listener):
        barrier.wait()
        conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    calls: list[int] = []
    finished = threading.Event()
    lock = threading.Lock()

    def done_for(index):
        def done(outcome):
            with lock:
                calls.append(index)
                if outcome.status != 204:
                    calls.append(-1)
                if len(calls) >= count:
                    finished.set()

        return done

    with listening("127.0.0.1", together) as server:
        sender().submit([(get(server.url(f"/{i}"), timeout_ms=8000), done_for(i)) for i in range(count)])
        assert finished.wait(10)
        time.sleep(0.1)  # a second call of any done would show now
    assert sorted(calls) == list(range(count))
    assert server.connections == count
