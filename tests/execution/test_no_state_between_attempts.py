"""Nothing one attempt receives is sent by the next: no cookies across calls or tenants, and
every attempt sends exactly its own request's headers, which the attempt log records.

The calls run through the real execution path (workers.pipeline.run_now: claim, record the
attempt, perform, finish), one after the other in this thread, so they share its connection
pools as the engine's calls do; the target is a raw-socket listener on 127.0.0.1.
"""

from __future__ import annotations

import pytest

from core.secrets import redact_headers
from execution.http import HttpRequest, perform
from execution.models import HttpExecution
from execution.wire import USER_AGENT
from orchestration.services import CallKey
from tests.support.factories import make_call
from tests.support.listeners import listening, respond
from workers.pipeline import run_now

SESSION_COOKIE = [("Set-Cookie", "session=acme-session-1; Path=/"), ("Set-Cookie", "other=2; Path=/; HttpOnly")]


def run(tenant_id: str, url: str, *, method: str = "GET", headers=None, body=None) -> HttpExecution:
    call = make_call(
        tenant_id, name="no state", method=method, url=url, headers=headers, body=body, correlation_id="no-state"
    )
    assert run_now([CallKey(tenant_id, call.pk)], worker_id="no-state") == 1
    return HttpExecution.objects.get(service_call_id=call.pk)


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


@pytest.mark.django_db(transaction=True)
def test_a_cookie_set_for_one_tenant_is_never_sent_for_another(world):
    with listening("127.0.0.1", respond(headers=SESSION_COOKIE)) as target:
        login = run("acme", target.url("/login"))
        echo = run("globex", target.url("/echo"), method="POST", body={"n": 1}, headers={"Authorization": "Bearer g-1"})
        again = run("acme", target.url("/again"))
        own = run("acme", target.url("/own"), headers={"Cookie": "pref=dark"})
    assert [e.response_status for e in (login, echo, again, own)] == [200, 200, 200, 200]
    received = target.headers_received()
    assert [lower(h).get("cookie") for h in received] == [None, None, None, "pref=dark"]


@pytest.mark.django_db(transaction=True)
def test_the_attempt_log_records_exactly_the_headers_that_were_sent(world):
    cases = [
        ("GET", None, {}),
        ("POST", {"order": [1, 2]}, {"Authorization": "Bearer t-secret-1", "X-Trace": "t-1"}),
        ("PUT", "plain text", {"Content-Type": "text/plain", "User-Agent": "caller/2", "Accept-Encoding": "gzip"}),
        ("DELETE", None, {"X-Api-Key": "k-secret-2"}),
        ("PATCH", {"a": None}, {"Content-Type": "application/merge-patch+json"}),
    ]
    with listening("127.0.0.1", respond(headers=SESSION_COOKIE)) as target:
        logged = [run("acme", target.url(f"/{n}"), method=m, body=b, headers=h) for n, (m, b, h) in enumerate(cases)]
        received = target.headers_received()
    assert len(received) == len(cases)
    for row, wire in zip(logged, received, strict=True):
        assert lower(row.request_headers) == lower(redact_headers(wire)), row.request_method
    # What the agent adds of its own, and no more (docs/security.md §2).
    port = target.port
    assert received[0] == {
        "User-Agent": USER_AGENT,
        "Accept-Encoding": "identity",
        "Host": f"127.0.0.1:{port}",
        "X-Service-Call-Id": str(logged[0].service_call_id),
        "X-Service-Call-Attempt": "1",
    }
    assert lower(received[1]) == {
        "user-agent": USER_AGENT,
        "accept-encoding": "identity",
        "host": f"127.0.0.1:{port}",
        "x-service-call-id": str(logged[1].service_call_id),
        "x-service-call-attempt": "1",
        "authorization": "Bearer t-secret-1",
        "x-trace": "t-1",
        "content-type": "application/json",
        "content-length": str(len('{"order":[1,2]}')),
    }
    assert lower(received[2])["user-agent"] == "caller/2"
    assert lower(received[2])["accept-encoding"] == "gzip"
    assert lower(received[3])["content-length"] == "0"
    assert lower(logged[1].request_headers)["authorization"] == "***"


def test_perform_alone_carries_no_cookie_from_one_attempt_to_the_next():
    with listening("127.0.0.1", respond(headers=SESSION_COOKIE)) as target:
        for path in ("/login", "/next", "/next"):
            assert perform(HttpRequest("GET", target.url(path), {}, None, 3000)).succeeded
    assert ["cookie" in lower(h) for h in target.headers_received()] == [False, False, False]
