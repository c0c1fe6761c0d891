"""execution/aio.py: many requests at once on one asyncio loop, under perform's rules.

Each behaviour here is asked of both transports: the asyncio sender must give the Outcome
`perform` gives (kind, message, status), so a webhook try fails and is described exactly as a
service call's attempt would be. Every server is a loopback listener (tests/support/listeners.py);
addresses outside loopback are only ever decided, never connected to.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from execution import aio, transport
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
    parse_head,
    read_head,
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
    with listening("127.0.0.1", respond()) as server:
        policy = policy_resolving({"hooks.example.test": ["127.0.0.1"]})
        url = f"http://hooks.example.test:{server.port}/in?x=1"
        post = get(url, method="POST", headers={"Content-Type": "application/json"}, body='{"a":1}')
        ours, theirs = both(post, policy=policy)
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
    assert theirs.error_kind == ErrorKind.EGRESS_DENIED and "a private address" in theirs.error_message
    assert "10.1.2.3" not in theirs.error_message  # a refusal names no address


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


def test_tls_refuses_a_certificate_no_trusted_authority_signed(tls_server):  # noqa: F811
    port, names = tls_server
    policy = policy_resolving({"secure.example.test": ["127.0.0.1"]})
    ours, theirs = both(get(f"https://secure.example.test:{port}/"), policy=policy)
    assert names == ["secure.example.test"] * 2
    assert theirs.error_kind == ours.error_kind == ErrorKind.TLS_ERROR
    assert theirs.error_message.startswith("certificate verify failed")


@pytest.fixture
def trusted_tls(tmp_path, monkeypatch):
    """A TLS server on 127.0.0.1 whose certificate, for good.example.test, a certificate
    authority signed that a fresh Sender trusts (its bundle: that authority alone). Answers
    every request 200 with the Host it got; counts its connections."""
    now = datetime.datetime.now(datetime.UTC)
    authority_key = ec.generate_private_key(ec.SECP256R1())
    authority_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test authority")])
    authority = (
        x509.CertificateBuilder()
        .subject_name(authority_name)
        .issuer_name(authority_name)
        .public_key(authority_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(authority_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "good.example.test")]))
        .issuer_name(authority_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("good.example.test")]), critical=False)
        .sign(authority_key, hashes.SHA256())
    )
    (tmp_path / "authority.pem").write_bytes(authority.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")

    connections = [0]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve_one(conn):  # keeps the connection for the next request, as receivers do
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                while head := read_head(tls):
                    host = parse_head(head)[1].get("Host", "")
                    body = f"host={host}".encode()
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        except (OSError, ssl.SSLError):
            pass

    def serve():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            connections[0] += 1
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    monkeypatch.setattr(aio, "DEFAULT_CA_BUNDLE_PATH", str(tmp_path / "authority.pem"))
    yield aio.Sender(), sock.getsockname()[1], connections
    stop.set()
    sock.close()


def test_tls_verifies_the_urls_name_not_only_the_chain(trusted_tls):
    """Both names lead to the same address; only the certificate's own name passes, and the
    kept-alive connection verified for one name is never used for the other."""
    fresh, port, connections = trusted_tls
    policy = policy_resolving({"good.example.test": ["127.0.0.1"], "bad.example.test": ["127.0.0.1"]})
    good = fresh.perform_many([get(f"https://good.example.test:{port}/")], policy=policy)[0]
    bad = fresh.perform_many([get(f"https://bad.example.test:{port}/")], policy=policy)[0]
    again = fresh.perform_many([get(f"https://good.example.test:{port}/")], policy=policy)[0]
    assert (good.succeeded, good.body_snippet) == (True, f"host=good.example.test:{port}")
    assert bad.error_kind == ErrorKind.TLS_ERROR
    assert bad.error_message.startswith("certificate verify failed: Hostname mismatch")
    assert again.succeeded
    assert connections[0] == 2  # good's, kept and used again; bad's, refused


def test_a_name_is_looked_up_by_the_system_resolver_under_the_settings_policy():
    """No test resolver: `localhost`, resolved by the system, checked, and connected to."""
    with listening("127.0.0.1", respond()) as server:
        ours, theirs = both(get(f"http://localhost:{server.port}/"))
    assert described(theirs) == described(ours) == (True, 200, None, None)
    assert f"Host: localhost:{server.port}\r\n".encode() in server.received[1]


def test_an_ipv6_address_is_connected_to(settings):
    settings.EGRESS_ALLOWLIST = ["127.0.0.0/8", "::1/128"]
    with listening("::1", respond()) as server:
        literal = both(get(f"http://[::1]:{server.port}/"))
        named = both(
            get(f"http://six.example.test:{server.port}/"), policy=policy_resolving({"six.example.test": ["::1"]})
        )
    assert [described(o) for o in (*literal, *named)] == [(True, 200, None, None)] * 4


def test_a_hung_lookup_never_holds_up_another_tries_lookup(monkeypatch):
    """Eight tries whose names never resolve (each abandoned at its deadline, its lookup still
    hanging), then one whose name resolves at once: it is not kept waiting for a lookup thread.
    (A lookup pool of its own: the eight threads stay idle a while after, which would change
    what other tests see.)"""
    monkeypatch.setattr(transport, "_lookup_threads", transport._LookupThreads())
    release = threading.Event()

    def resolver(host, port):
        if host.startswith("hung"):
            release.wait(10)
        return ["127.0.0.1"]

    policy = policy_resolving({})
    policy.resolver = resolver
    try:
        with listening("127.0.0.1", respond()) as server:
            hung = sender().perform_many(
                [get(f"http://hung{i}.example.test:{server.port}/", timeout_ms=300) for i in range(8)], policy=policy
            )
            started = time.monotonic()
            quick = send(get(f"http://quick.example.test:{server.port}/", timeout_ms=2000), policy=policy)
            elapsed = time.monotonic() - started
    finally:
        release.set()
    assert {o.error_kind for o in hung} == {ErrorKind.TIMEOUT}
    assert quick.succeeded, quick.error_message
    assert elapsed < 1.5


def test_nothing_is_sent_twice_not_even_an_idempotent_request():
    """aiohttp itself would send a GET or PUT again after a reset; perform's rule sends it again
    only on a reused connection, so on a fresh one neither does."""
    for method in ("GET", "PUT"):
        with listening("127.0.0.1", reset) as server:
            ours, theirs = both(get(server.url(), method=method))
            assert described(theirs) == described(ours) == (False, None, ErrorKind.NETWORK_ERROR, "connection reset")
            assert server.connections == 2, method  # one each


def test_no_request_inside_a_database_transaction(transactional_db):
    from django.db import transaction

    with transaction.atomic(), pytest.raises(RuntimeError, match="transaction"):
        send(get("http://127.0.0.1:9/"))


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
