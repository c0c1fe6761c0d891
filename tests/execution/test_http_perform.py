"""perform(): one attempt, pinned to the checked address, with short human error messages.

Every server here is a loopback listener; names are mapped to loopback by a test resolver.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from execution.egress import EgressPolicy
from execution.http import HttpRequest, perform
from execution.outcomes import ErrorKind
from tests.support.listeners import (
    close_quietly,
    free_port,
    garbage,
    listening,
    redirect_to,
    reset,
    respond,
)


def get(url: str, *, headers: dict[str, str] | None = None, timeout_ms: int = 3000, body=None, method="GET"):
    return HttpRequest(method=method, url=url, headers=headers or {}, body=body, timeout_ms=timeout_ms)


def policy_resolving(mapping: dict[str, list[str]]) -> EgressPolicy:
    policy = EgressPolicy.from_settings()

    def resolver(host: str, port: int) -> list[str]:
        if host not in mapping:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return mapping[host]

    policy.resolver = resolver
    return policy


def test_a_2xx_response_succeeds_with_status_headers_and_snippet(http_target):
    outcome = perform(get(http_target.url("/json")))
    assert outcome.succeeded
    assert outcome.status == 200
    assert outcome.headers["Content-Type"] == "application/json"
    assert '"hello"' in outcome.body_snippet
    assert outcome.latency_ms is not None


def test_a_non_2xx_response_is_an_http_error_with_its_status(http_target):
    outcome = perform(get(http_target.url("/status/418")))
    assert (outcome.succeeded, outcome.error_kind, outcome.status) == (False, ErrorKind.HTTP_ERROR, 418)


def test_it_sends_the_body_and_headers_as_given(http_target):
    outcome = perform(get(http_target.url("/echo"), method="POST", headers={"X-Trace": "t-1"}, body={"a": [1, 2]}))
    assert outcome.succeeded
    sent = http_target.requests[-1]
    assert sent["body"] == '{"a":[1,2]}'
    assert sent["headers"]["X-Trace"] == "t-1"
    assert sent["headers"]["Content-Type"] == "application/json"
    assert sent["headers"]["Host"] == f"127.0.0.1:{http_target.port}"
    # None of requests' own defaults (gzip, keep-alive, */*), only the User-Agent.
    assert sent["headers"].get("Accept-Encoding", "identity") == "identity"
    assert "Accept" not in sent["headers"]
    assert sent["headers"]["User-Agent"] == "ServiceAgent/1.0"


def test_it_keeps_the_host_name_in_the_host_header_while_connecting_to_the_checked_address():
    with listening("127.0.0.1", respond()) as server:
        policy = policy_resolving({"api.example.test": ["127.0.0.1"]})
        outcome = perform(get(f"http://api.example.test:{server.port}/v1"), policy=policy)
        assert outcome.succeeded
        assert f"Host: api.example.test:{server.port}\r\n" in server.requests_text()
        assert server.requests_text().startswith("GET /v1 HTTP/1.1\r\n")


def test_a_redirect_is_returned_not_followed():
    with (
        listening("127.0.0.1", respond()) as elsewhere,
        listening("127.0.0.1", redirect_to(elsewhere.url("/next"))) as server,
    ):
        outcome = perform(get(server.url("/start")))
    assert (outcome.error_kind, outcome.status) == (ErrorKind.HTTP_ERROR, 302)
    assert outcome.headers["Location"] == elsewhere.url("/next")
    assert elsewhere.connections == 0


@pytest.mark.parametrize(
    "name",
    [
        "Host",
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Keep-Alive",
        "TE",
        "Trailer",
        "Upgrade",
        "Proxy-Authorization",
        "Proxy-Connection",
        "proxy-anything",
    ],
)
def test_it_refuses_hop_by_hop_and_agent_owned_headers_without_sending(name):
    with listening("127.0.0.1", respond()) as server:
        outcome = perform(get(server.url(), headers={name: "x"}))
    assert outcome.error_kind == ErrorKind.EGRESS_DENIED
    assert name in outcome.error_message
    assert server.connections == 0


def test_secret_response_headers_are_redacted_in_the_outcome():
    cookie = "session=abcdef123456; HttpOnly"
    with listening("127.0.0.1", respond(headers=[("Set-Cookie", cookie), ("X-Plain", "visible")])) as server:
        outcome = perform(get(server.url()))
    assert outcome.headers["Set-Cookie"] == "***"
    assert outcome.headers["X-Plain"] == "visible"
    assert "abcdef123456" not in repr(outcome)


def test_secret_values_echoed_by_the_target_are_scrubbed_from_the_snippet(http_target):
    outcome = perform(get(http_target.url("/echo"), headers={"Authorization": "Bearer sup3r-s3cret-value"}))
    assert outcome.succeeded
    assert http_target.requests[-1]["headers"]["Authorization"] == "Bearer sup3r-s3cret-value"
    assert "sup3r-s3cret-value" not in outcome.body_snippet
    assert "***" in outcome.body_snippet


# --- Short, human error messages ------------------------------------------------------------


def _assert_short(message: str) -> None:
    assert len(message) <= 120, message
    for noise in ("<urllib3", "HTTPConnectionPool", "Max retries", "object at 0x", "Errno"):
        assert noise not in message, message


def test_a_closed_port_is_connection_refused():
    outcome = perform(get(f"http://127.0.0.1:{free_port()}/"))
    assert (outcome.error_kind, outcome.error_message) == (ErrorKind.NETWORK_ERROR, "connection refused")


def test_a_name_that_does_not_resolve_says_so():
    outcome = perform(get("http://nowhere.example.test/"), policy=policy_resolving({}))
    assert (outcome.error_kind, outcome.error_message) == (ErrorKind.NETWORK_ERROR, "name does not resolve")


def test_a_reset_connection_says_connection_reset():
    with listening("127.0.0.1", reset) as server:
        outcome = perform(get(server.url()))
    assert (outcome.error_kind, outcome.error_message) == (ErrorKind.NETWORK_ERROR, "connection reset")


def test_a_connection_closed_without_an_answer_says_so():
    with listening("127.0.0.1", close_quietly) as server:
        outcome = perform(get(server.url()))
    assert outcome.error_kind == ErrorKind.NETWORK_ERROR
    assert outcome.error_message == "connection closed before a response"


def test_a_non_http_answer_says_so():
    with listening("127.0.0.1", garbage) as server:
        outcome = perform(get(server.url()))
    assert outcome.error_kind == ErrorKind.NETWORK_ERROR
    _assert_short(outcome.error_message)
    assert outcome.error_message == "not an HTTP response"


def test_a_timeout_names_the_budget(http_target):
    outcome = perform(get(http_target.url("/delay/2000"), timeout_ms=200))
    assert (outcome.error_kind, outcome.error_message) == (ErrorKind.TIMEOUT, "no complete response within 200 ms")


def test_error_messages_never_carry_secret_values():
    secret = "Bearer very-secret-token-42"
    with listening("127.0.0.1", reset) as server:
        outcome = perform(get(server.url(), headers={"Authorization": secret}))
    assert secret not in (outcome.error_message or "")


# --- TLS: the server name is the URL's, the address the checked one ----------------------------


@pytest.fixture
def tls_server():
    """A TLS server on 127.0.0.1 with a self-signed certificate for secure.example.test,
    recording the server names (SNI) clients ask for."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "secure.example.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("secure.example.test")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    import tempfile
    from pathlib import Path

    directory = Path(tempfile.mkdtemp())
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    names: list[str | None] = []
    context.sni_callback = lambda sock, server_name, ctx: names.append(server_name)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(4096)
            except (OSError, ssl.SSLError):
                pass

    threading.Thread(target=serve, daemon=True).start()
    yield sock.getsockname()[1], names
    stop.set()
    sock.close()


def test_tls_sends_the_urls_host_as_server_name_and_verifies_the_certificate(tls_server):
    port, names = tls_server
    policy = policy_resolving({"secure.example.test": ["127.0.0.1"]})
    outcome = perform(get(f"https://secure.example.test:{port}/"), policy=policy)
    assert names == ["secure.example.test"]
    # The certificate is self-signed: verification fails, with a short message.
    assert outcome.error_kind == ErrorKind.TLS_ERROR
    assert outcome.error_message.startswith("certificate verify failed")
    _assert_short(outcome.error_message)


def test_tls_to_a_plain_http_server_is_a_tls_error():
    with listening("127.0.0.1", garbage) as server:
        outcome = perform(get(f"https://127.0.0.1:{server.port}/"))
    assert outcome.error_kind == ErrorKind.TLS_ERROR
    _assert_short(outcome.error_message)
