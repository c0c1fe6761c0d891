"""Hostile targets cost one bounded attempt (docs/security.md §3): slow drips of headers or body, hung
servers and resolvers, floods of headers, huge headers, endless bodies and gzip bombs.

Each attempt here has a short timeout and each test bounds its own wall time; the servers are
raw sockets on 127.0.0.1 (tests/support/listeners.py).
"""

from __future__ import annotations

import gzip
import time
import tracemalloc

import pytest

from execution.egress import EgressPolicy
from execution.http import HttpRequest, perform
from execution.outcomes import ErrorKind
from orchestration.models import ServiceCall
from tests.support.factories import make_call
from tests.support.listeners import (
    big_headers,
    body_drip,
    continue_flood,
    endless_body,
    endless_gzip,
    header_drip,
    listening,
    many_headers,
    respond,
    silent,
)
from tests.support.waiting import wait_for


def get(url: str, timeout_ms: int = 600) -> HttpRequest:
    return HttpRequest(method="GET", url=url, headers={}, body=None, timeout_ms=timeout_ms)


def timed(request: HttpRequest, **kwargs):
    started = time.monotonic()
    outcome = perform(request, **kwargs)
    return outcome, time.monotonic() - started


# --- Time: one deadline for the whole attempt -----------------------------------------------


@pytest.mark.parametrize(
    "behaviour",
    [header_drip(0.05), body_drip, silent],
    ids=["header-drip", "body-drip", "hung"],
)
def test_a_slow_or_hung_target_ends_in_timeout_at_the_deadline(behaviour):
    with listening("127.0.0.1", behaviour) as server:
        outcome, elapsed = timed(get(server.url(), timeout_ms=600))
    assert outcome.error_kind == ErrorKind.TIMEOUT
    assert outcome.error_message == "no complete response within 600 ms"
    # The drip sends a byte every 50 ms: a per-read timeout would never fire.
    assert 0.55 <= elapsed < 1.2


def test_the_fixtures_drip_endpoint_is_cut_at_the_deadline_too(http_target):
    outcome, elapsed = timed(get(http_target.url("/drip"), timeout_ms=500))
    assert outcome.error_kind == ErrorKind.TIMEOUT
    assert elapsed < 1.1


def test_a_hung_resolver_ends_in_timeout_at_the_deadline():
    policy = EgressPolicy.from_settings()
    policy.resolver = lambda host, port: time.sleep(5) or ["127.0.0.1"]
    outcome, elapsed = timed(get("http://slow-dns.example.test/", timeout_ms=300), policy=policy)
    assert outcome.error_kind == ErrorKind.TIMEOUT
    assert elapsed < 0.8


# --- Response headers: counted and sized ----------------------------------------------------


def test_a_flood_of_headers_is_refused_quickly():
    with listening("127.0.0.1", many_headers(5000)) as server:
        outcome, elapsed = timed(get(server.url(), timeout_ms=5000))
    assert (outcome.error_kind, outcome.error_message) == (
        ErrorKind.NETWORK_ERROR,
        "the response has more than 100 headers",
    )
    assert elapsed < 1


def test_exactly_the_allowed_number_of_headers_passes(settings):
    settings.RESPONSE_MAX_HEADERS = 20
    with listening("127.0.0.1", many_headers(18)) as server:  # + Content-Length, Connection
        assert perform(get(server.url())).succeeded
    with listening("127.0.0.1", many_headers(19)) as server:
        outcome = perform(get(server.url()))
    assert outcome.error_message == "the response has more than 20 headers"


def test_a_huge_header_is_refused_quickly():
    with listening("127.0.0.1", big_headers(1, 5 * 1024 * 1024)) as server:
        outcome, elapsed = timed(get(server.url(), timeout_ms=5000))
    assert outcome.error_kind == ErrorKind.NETWORK_ERROR
    assert outcome.error_message == "the response headers exceed 65536 bytes"
    assert elapsed < 1


def test_many_medium_headers_are_refused_by_total_size():
    with listening("127.0.0.1", big_headers(90, 1024)) as server:  # 90 KiB, under 100 headers
        outcome = perform(get(server.url(), timeout_ms=5000))
    assert outcome.error_message == "the response headers exceed 65536 bytes"


def test_endless_interim_responses_are_refused():
    with listening("127.0.0.1", continue_flood) as server:
        outcome, elapsed = timed(get(server.url(), timeout_ms=5000))
    assert outcome.error_kind == ErrorKind.NETWORK_ERROR
    assert "more than 100 headers" in outcome.error_message
    assert elapsed < 1


# --- Response bodies: read up to the cap after decompression, only the snippet kept ---------


def _peak_memory(request: HttpRequest):
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        started = time.monotonic()
        outcome = perform(request)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return outcome, peak, elapsed


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)  # 64 MiB in ~64 KiB


def test_a_gzip_bomb_costs_at_most_the_cap_in_memory(settings, bomb):
    cap = settings.RESPONSE_BODY_MAX_BYTES
    with listening("127.0.0.1", respond(body=bomb, headers=[("Content-Encoding", "gzip")])) as server:
        outcome, peak, elapsed = _peak_memory(get(server.url(), timeout_ms=5000))
    assert outcome.succeeded and outcome.body_truncated
    assert len(outcome.body_snippet) == settings.RESPONSE_BODY_SNIPPET_BYTES
    assert len(bomb) < cap < 64 * 1024 * 1024
    assert peak <= cap, f"peak {peak} bytes for a cap of {cap}"
    assert elapsed < 2


def test_an_endless_gzip_stream_is_cut_at_the_cap(settings):
    with listening("127.0.0.1", endless_gzip) as server:
        outcome, peak, elapsed = _peak_memory(get(server.url(), timeout_ms=5000))
    assert outcome.succeeded and outcome.body_truncated
    assert outcome.body_snippet == "\ufffd" * settings.RESPONSE_BODY_SNIPPET_BYTES  # NULs, stored as U+FFFD
    assert peak <= settings.RESPONSE_BODY_MAX_BYTES
    assert elapsed < 2


def test_an_endless_body_is_cut_at_the_cap_without_waiting_for_its_end(settings):
    with listening("127.0.0.1", endless_body) as server:
        outcome, peak, elapsed = _peak_memory(get(server.url(), timeout_ms=5000))
    assert outcome.succeeded and outcome.body_truncated
    assert outcome.body_snippet == "x" * settings.RESPONSE_BODY_SNIPPET_BYTES
    assert peak <= settings.RESPONSE_BODY_MAX_BYTES
    assert elapsed < 2


def test_the_fixtures_gzip_bomb_and_big_body_are_capped(http_target):
    for path in ("/gzip-bomb", "/big/5000000"):
        outcome, elapsed = timed(get(http_target.url(path), timeout_ms=10_000))
        assert outcome.succeeded and outcome.body_truncated, path
        assert elapsed < 5


def test_a_redirect_with_an_endless_body_is_a_capped_response_too():
    def redirect_then_stream(conn, head, listener):
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/\r\nTransfer-Encoding: chunked\r\n\r\n")
        frame = b"10000\r\n" + b"r" * 65536 + b"\r\n"
        while not listener.stopped.is_set():
            conn.sendall(frame)

    with listening("127.0.0.1", redirect_then_stream) as server:
        outcome, elapsed = timed(get(server.url(), timeout_ms=5000))
    assert (outcome.error_kind, outcome.status, outcome.body_truncated) == (ErrorKind.HTTP_ERROR, 302, True)
    assert elapsed < 2


def test_a_small_body_is_complete_and_not_truncated(http_target):
    outcome = perform(get(http_target.url("/big/100")))
    assert (outcome.body_snippet, outcome.body_truncated) == ("x" * 100, False)


# --- Other tenants never wait for a hostile target ------------------------------------------


def test_hostile_targets_of_one_tenant_never_delay_another_tenants_call(world, http_target, engine, bomb):
    with (
        listening("127.0.0.1", header_drip(0.05)) as drip,
        listening("127.0.0.1", silent) as hung,
        listening("127.0.0.1", many_headers(5000)) as flood,
        listening("127.0.0.1", endless_gzip) as gzip_stream,
        listening("127.0.0.1", respond(body=bomb, headers=[("Content-Encoding", "gzip")])) as gzip_bomb,
    ):
        hostile = []
        for _ in range(3):
            hostile += [
                make_call("globex", url=drip.url(), timeout_ms=3000),
                make_call("globex", url=hung.url(), timeout_ms=3000),
                make_call("globex", url=flood.url(), timeout_ms=3000),
                make_call("globex", url=gzip_stream.url(), timeout_ms=3000),
                make_call("globex", url=gzip_bomb.url(), timeout_ms=3000),
                make_call("globex", url=http_target.url("/drip"), timeout_ms=3000),
            ]
        # Due while every hostile attempt is still in flight (their deadline is 3 s).
        acme = make_call("acme", url=http_target.url("/json"), timeout_ms=3000, due_in=2)
        done = wait_for(lambda: (c := ServiceCall.objects.get(pk=acme.pk)).is_terminal and c, timeout=10)
        assert done.status == ServiceCall.Status.SUCCEEDED
        lateness = (done.started_at - done.due_at).total_seconds()
        assert 0 <= lateness < 0.1, f"acme's call started {lateness * 1000:.0f} ms late"
        # acme finished while globex's slow attempts were still running.
        assert ServiceCall.objects.filter(pk__in=[c.pk for c in hostile], status=ServiceCall.Status.RUNNING).exists()
        wait_for(lambda: all(ServiceCall.objects.get(pk=c.pk).is_terminal for c in hostile), timeout=10)
    kinds = {ServiceCall.objects.get(pk=c.pk).error_kind for c in hostile}
    assert kinds <= {ErrorKind.TIMEOUT, ErrorKind.NETWORK_ERROR, None}
    assert ErrorKind.TIMEOUT in kinds


# --- Bytes a database cannot hold -------------------------------------------------------------


def test_a_nul_in_the_response_body_or_headers_is_stored_as_a_replacement_character(world, engine):
    # PostgreSQL's text and jsonb refuse U+0000: unscrubbed, finishing this call would fail.
    body = b'{"a":"x\x00y"}'
    with listening("127.0.0.1", respond(body=body, headers=[("X-Odd", "a\x00b")])) as target:
        call = make_call("acme", url=target.url(), timeout_ms=3000)
        done = wait_for(lambda: (c := ServiceCall.objects.get(pk=call.pk)).is_terminal and c, timeout=10)
    meta = done.outcome_meta["responseMeta"]
    assert done.status == ServiceCall.Status.SUCCEEDED
    assert meta["bodySnippet"] == '{"a":"x\ufffdy"}'
    assert meta["headers"]["X-Odd"] == "a\ufffdb"
