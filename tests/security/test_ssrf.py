"""SSRF variants against a loopback listener the allowlist excludes: not one connection.

Each variant is tried at the edge (validation: an IP literal the policy refuses is a 400 at
once) and at execution (perform: EgressDenied, whatever the edge said), and must not reach
the listener, not even with a TCP handshake. Then the listener is allowed and the very same
call reaches it. Everything listens on loopback; other private ranges are covered at the
decision level (tests/execution/test_egress_policy.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.test import override_settings

from core.errors import ValidationFailed
from execution.egress import EgressPolicy
from execution.http import HttpRequest, perform
from execution.outcomes import ErrorKind
from orchestration.models import ServiceCall
from orchestration.validation import validate_submission
from tests.support.factories import make_call
from tests.support.listeners import Listener, listening, redirect_to, respond
from tests.support.waiting import wait_for

# The allowlist while refusing: a name and an address that are not the listener, and the
# listener's address on another port, so "allowed host, other port" is exercised too.
REFUSING = ["allowed.test", "127.0.0.2", "127.0.0.1:1", "localhost:1"]
NOT_THE_AGENT = "http://agent.test:8000"


@dataclass(frozen=True)
class Variant:
    id: str
    url: str  # {p}: the IPv4 listener's port, {p6}: the IPv6 listener's
    edge: str  # "literal": 400 while refused, accepted once allowed; "name": accepted; "credentials": always 400
    allow: tuple[str, ...] = ("127.0.0.1", "::1")
    resolver: dict[str, list[str]] | None = None
    ipv6: bool = False


VARIANTS = [
    Variant("dotted", "http://127.0.0.1:{p}/", "literal"),
    Variant("short-2", "http://127.1:{p}/", "literal"),
    Variant("short-3", "http://127.0.1:{p}/", "literal"),
    Variant("hex", "http://0x7f000001:{p}/", "literal"),
    Variant("hex-upper", "http://0X7F000001:{p}/", "literal"),
    Variant("decimal", "http://2130706433:{p}/", "literal"),
    Variant("octal", "http://017700000001:{p}/", "literal"),
    Variant("dotted-hex", "http://0x7f.0x0.0x0.0x1:{p}/", "literal"),
    Variant("dotted-octal", "http://0177.0.0.01:{p}/", "literal"),
    Variant("zero-padded", "http://127.000.000.001:{p}/", "literal"),
    Variant("mixed-hex", "http://0x7f.1:{p}/", "literal"),
    Variant("other-loopback", "http://127.0.0.1:{p}/path?q=1", "literal", allow=("127.0.0.0/8",)),
    Variant("mapped", "http://[::ffff:127.0.0.1]:{p}/", "literal"),
    Variant("mapped-hex", "http://[::ffff:7f00:1]:{p}/", "literal"),
    Variant("mapped-long", "http://[0:0:0:0:0:ffff:127.0.0.1]:{p}/", "literal"),
    Variant("ipv6", "http://[::1]:{p6}/", "literal", ipv6=True),
    Variant("ipv6-long", "http://[0:0:0:0:0:0:0:1]:{p6}/", "literal", ipv6=True),
    Variant("ipv6-unspecified", "http://[::]:{p6}/", "literal", allow=("::/128",), ipv6=True),
    Variant("unspecified", "http://0.0.0.0:{p}/", "literal", allow=("0.0.0.0",)),
    Variant("zero", "http://0:{p}/", "literal", allow=("0.0.0.0",)),
    Variant("percent-encoded", "http://%31%32%37.0.0.1:{p}/", "literal"),
    Variant("percent-encoded-hex", "http://%30x7f000001:{p}/", "literal"),
    Variant("https", "https://127.0.0.1:{p}/", "literal"),
    Variant("localhost", "http://localhost:{p}/", "name"),
    Variant("localhost-upper", "http://LOCALHOST:{p}/", "name"),
    Variant(
        "name-to-loopback",
        "http://internal.example.test:{p}/",
        "name",
        resolver={"internal.example.test": ["127.0.0.1"]},
    ),
    Variant(
        "name-to-mapped",
        "http://mapped.example.test:{p}/",
        "name",
        resolver={"mapped.example.test": ["::ffff:127.0.0.1"]},
    ),
    Variant(
        "name-to-allowed-and-loopback",
        "http://split.example.test:{p}/",
        "name",
        resolver={"split.example.test": ["127.0.0.2", "127.0.0.1"]},
    ),
    Variant("allowed-name-as-userinfo", "http://allowed.test@127.0.0.1:{p}/", "credentials"),
    Variant("allowed-name-as-password", "http://allowed.test:80@127.0.0.1:{p}/", "credentials"),
    Variant("allowed-name-after-fragment", "http://127.0.0.1:{p}#@allowed.test/", "literal"),
    Variant("allowed-name-after-query", "http://127.0.0.1:{p}?@allowed.test/", "literal"),
    Variant("allowed-name-in-path", "http://127.0.0.1:{p}/allowed.test", "literal"),
]


@pytest.fixture
def listeners():
    with listening("127.0.0.1", respond()) as v4, listening("::1", respond()) as v6:
        yield v4, v6


def _url(variant: Variant, v4: Listener, v6: Listener) -> str:
    return variant.url.format(p=v4.port, p6=v6.port)


def _policy(variant: Variant) -> EgressPolicy | None:
    if variant.resolver is None:
        return None
    policy = EgressPolicy.from_settings()
    mapping = variant.resolver
    policy.resolver = lambda host, port: mapping[host]
    return policy


def _edge(url: str) -> dict[str, list[str]] | None:
    try:
        validate_submission({"name": "probe", "requestSpec": {"method": "GET", "url": url}})
    except ValidationFailed as exc:
        return exc.errors
    return None


def _send(variant: Variant, url: str):
    return perform(HttpRequest(method="GET", url=url, headers={}, body=None, timeout_ms=3000), policy=_policy(variant))


def test_there_are_at_least_25_variants():
    assert len(VARIANTS) >= 25
    assert len({v.id for v in VARIANTS}) == len(VARIANTS)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_it_refuses_the_variant_without_a_single_connection(variant, listeners):
    v4, v6 = listeners
    url = _url(variant, v4, v6)
    with override_settings(EGRESS_ALLOWLIST=REFUSING, AGENT_BASE_URL=NOT_THE_AGENT):
        edge = _edge(url)
        outcome = _send(variant, url)
    if variant.edge in ("literal", "credentials"):
        assert edge is not None and list(edge) == ["requestSpec.url"], edge
    else:
        assert edge is None
    assert outcome.error_kind == ErrorKind.EGRESS_DENIED, outcome
    assert (v4.connections, v6.connections) == (0, 0)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_the_same_call_reaches_the_listener_once_it_is_allowed(variant, listeners):
    v4, v6 = listeners
    url = _url(variant, v4, v6)
    with override_settings(EGRESS_ALLOWLIST=REFUSING + list(variant.allow), AGENT_BASE_URL=NOT_THE_AGENT):
        edge = _edge(url)
        outcome = _send(variant, url)
    if variant.edge == "credentials":
        assert edge is not None and "credentials" in edge["requestSpec.url"][0]
    else:
        assert edge is None, edge
    target, other = (v6, v4) if variant.ipv6 else (v4, v6)
    if variant.url.startswith("https"):
        # A plain listener cannot speak TLS: reaching it is the proof.
        assert outcome.error_kind == ErrorKind.TLS_ERROR, outcome
    elif variant.id == "name-to-allowed-and-loopback":
        # Connected to the first checked address (127.0.0.2 has no listener here).
        assert outcome.error_kind == ErrorKind.NETWORK_ERROR
        assert target.connections == 0
        return
    else:
        assert outcome.succeeded, outcome
    assert (target.connections, other.connections) == (1, 0)


def test_a_rebinding_name_connects_to_the_address_that_was_checked(listeners):
    """First answer: an allowed address; every later answer: the refused listener."""
    v4, _ = listeners
    answers: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        answers.append(host)
        return ["127.0.0.2"] if len(answers) == 1 else ["127.0.0.1"]

    with (
        override_settings(EGRESS_ALLOWLIST=REFUSING, AGENT_BASE_URL=NOT_THE_AGENT),
        listening("127.0.0.2", respond(body=b"checked"), port=v4.port) as checked,
    ):
        policy = EgressPolicy.from_settings()
        policy.resolver = rebinding
        first = perform(HttpRequest("GET", f"http://rebind.example.test:{v4.port}/", {}, None, 3000), policy=policy)
        second = perform(HttpRequest("GET", f"http://rebind.example.test:{v4.port}/", {}, None, 3000), policy=policy)
    assert first.succeeded and first.body_snippet == "checked"
    assert f"Host: rebind.example.test:{v4.port}" in checked.requests_text()
    assert answers == ["rebind.example.test", "rebind.example.test"]  # once per attempt, never by urllib3
    assert second.error_kind == ErrorKind.EGRESS_DENIED
    assert (checked.connections, v4.connections) == (1, 0)


def test_a_redirect_from_an_allowed_host_to_the_listener_is_not_followed(listeners):
    v4, _ = listeners
    with (
        override_settings(EGRESS_ALLOWLIST=REFUSING, AGENT_BASE_URL=NOT_THE_AGENT),
        listening("127.0.0.2", redirect_to(f"http://127.0.0.1:{v4.port}/")) as allowed,
    ):
        outcome = perform(HttpRequest("GET", allowed.url("/"), {}, None, 3000))
    assert (outcome.error_kind, outcome.status) == (ErrorKind.HTTP_ERROR, 302)
    assert outcome.headers["Location"] == f"http://127.0.0.1:{v4.port}/"
    assert (allowed.connections, v4.connections) == (1, 0)


PROXY_VARIABLES = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]


def test_proxy_variables_are_ignored(listeners, monkeypatch):
    v4, _ = listeners
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, v4.url())
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with (
        override_settings(EGRESS_ALLOWLIST=REFUSING, AGENT_BASE_URL=NOT_THE_AGENT),
        listening("127.0.0.2", respond(body=b"direct")) as allowed,
    ):
        direct = perform(HttpRequest("GET", allowed.url("/"), {}, None, 3000))
        https = perform(HttpRequest("GET", f"https://127.0.0.2:{allowed.port}/", {}, None, 3000))
        refused = perform(HttpRequest("GET", v4.url("/"), {}, None, 3000))
    assert direct.succeeded and direct.body_snippet == "direct"
    assert https.error_kind == ErrorKind.TLS_ERROR  # went straight to the allowed plain listener
    assert refused.error_kind == ErrorKind.EGRESS_DENIED
    assert allowed.connections == 2
    assert v4.connections == 0


@pytest.mark.parametrize("host", ["１２７.０.０.１", "127。0。0。1", "１２７。０。０。１"])
def test_unicode_look_alikes_of_the_address_are_invalid_at_the_edge_and_reach_nothing(host, listeners):
    v4, v6 = listeners
    url = f"http://{host}:{v4.port}/"
    for allowlist in (REFUSING, REFUSING + ["127.0.0.0/8"]):
        with override_settings(EGRESS_ALLOWLIST=allowlist, AGENT_BASE_URL=NOT_THE_AGENT):
            errors = _edge(url)
            outcome = perform(HttpRequest("GET", url, {}, None, 3000))
        assert errors == {"requestSpec.url": ["The URL's host is not valid: the host is not a valid name or address."]}
        # The HTTP client cannot encode such a host (strict IDNA): it fails before any socket.
        assert (outcome.error_kind, outcome.error_message) == (ErrorKind.NETWORK_ERROR, "the URL is not valid")
    assert (v4.connections, v6.connections) == (0, 0)


# --- End to end: submitted, run by the engine, state read back from the database -------------

E2E = [v for v in VARIANTS if v.resolver is None]


def _submit_all(urls: list[str]) -> tuple[list[ServiceCall], int]:
    calls, refused_at_edge = [], 0
    for index, url in enumerate(urls):
        try:
            calls.append(make_call(name=f"ssrf {index}", url=url, timeout_ms=3000))
        except ValidationFailed:
            refused_at_edge += 1
    return calls, refused_at_edge


def _all_terminal(calls: list[ServiceCall]) -> list[ServiceCall] | None:
    fresh = list(ServiceCall.objects.filter(pk__in=[c.pk for c in calls]))
    return fresh if all(c.is_terminal for c in fresh) else None


def test_submitted_variants_end_egress_denied_or_400_and_reach_nothing(world, engine, listeners):
    v4, v6 = listeners
    urls = [_url(v, v4, v6) for v in E2E]
    with override_settings(EGRESS_ALLOWLIST=REFUSING, AGENT_BASE_URL=NOT_THE_AGENT):
        before = ServiceCall.objects.count()
        calls, refused_at_edge = _submit_all(urls)
        assert ServiceCall.objects.count() == before + len(calls)  # a 400 stores nothing
        done = wait_for(lambda: _all_terminal(calls), timeout=15)
    assert refused_at_edge + len(calls) == len(E2E)
    assert refused_at_edge >= 20 and len(calls) >= 2
    assert {(c.status, c.error_kind) for c in done} == {(ServiceCall.Status.FAILED, ErrorKind.EGRESS_DENIED)}
    assert all("EGRESS_ALLOWLIST" in c.outcome_meta["errorMeta"]["message"] for c in done)
    assert (v4.connections, v6.connections) == (0, 0)


def test_submitted_variants_run_once_the_listener_is_allowed(world, engine, listeners):
    v4, v6 = listeners
    runnable = [v for v in E2E if v.edge != "credentials" and not v.url.startswith("https")]
    allow = sorted({entry for v in runnable for entry in v.allow})
    with override_settings(EGRESS_ALLOWLIST=REFUSING + allow, AGENT_BASE_URL=NOT_THE_AGENT):
        calls, refused_at_edge = _submit_all([_url(v, v4, v6) for v in runnable])
        done = wait_for(lambda: _all_terminal(calls), timeout=15)
    assert refused_at_edge == 0
    assert {c.status for c in done} == {ServiceCall.Status.SUCCEEDED}
    assert v4.connections + v6.connections == len(runnable)


def test_a_literal_refused_at_the_edge_names_the_policy(settings):
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = NOT_THE_AGENT
    errors = _edge("http://169.254.169.254/latest/meta-data/")
    assert errors == {
        "requestSpec.url": [
            "The URL is refused by the egress policy: the URL points to a metadata address, not in EGRESS_ALLOWLIST."
        ]
    }


# --- The agent's own origin: its mock target only ------------------------------------------

OWN_ORIGIN_REFUSED = [
    "/",
    "/admin/login/",
    "/metrics",
    "/api/v1/service-calls",
    "/mock",
    "/mockx/echo",
    "/MOCK/echo",
    "/mock/../admin/",
    "/mock/%2e%2e/admin/",
    "/mock/.%2E/admin/",
    "/mock%2F..%2Fadmin/",
]


def _resolving_to_loopback() -> EgressPolicy:
    policy = EgressPolicy.from_settings()
    policy.resolver = lambda host, port: ["127.0.0.1"]
    return policy


@pytest.mark.parametrize("path", OWN_ORIGIN_REFUSED)
def test_the_agents_own_origin_outside_mock_is_refused_and_reaches_nothing(path, listeners, settings):
    """The listener stands in for the agent: AGENT_BASE_URL names it, and only the mock
    exception would allow it (no EGRESS_ALLOWLIST entry)."""
    v4, _ = listeners
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = f"http://127.0.0.1:{v4.port}"
    url = v4.url(path)
    errors = _edge(url)
    assert errors is not None and "only paths under /mock/ are allowed" in errors["requestSpec.url"][0], errors
    outcome = perform(HttpRequest("GET", url, {}, None, 3000))
    assert outcome.error_kind == ErrorKind.EGRESS_DENIED, outcome
    # A name resolving to the agent's origin is judged by the same rule when the call runs.
    settings.AGENT_BASE_URL = f"http://agent.test:{v4.port}"
    by_name = _resolving_to_loopback()
    named = f"http://agent.test:{v4.port}{path}"
    assert _edge(named) is None  # a name is judged when the call runs
    outcome = perform(HttpRequest("GET", named, {}, None, 3000), policy=by_name)
    assert outcome.error_kind == ErrorKind.EGRESS_DENIED, outcome
    assert v4.connections == 0


def test_the_agents_own_mock_target_is_reached(listeners, settings):
    v4, _ = listeners
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = f"http://127.0.0.1:{v4.port}"
    assert _edge(v4.url("/mock/echo")) is None
    assert perform(HttpRequest("GET", v4.url("/mock/echo"), {}, None, 3000)).succeeded
    settings.AGENT_BASE_URL = f"http://agent.test:{v4.port}"
    by_name = _resolving_to_loopback()
    assert perform(
        HttpRequest("GET", f"http://agent.test:{v4.port}/mock/json", {}, None, 3000), policy=by_name
    ).succeeded
    assert v4.connections == 2
    assert v4.request_lines() == ["GET /mock/echo HTTP/1.1", "GET /mock/json HTTP/1.1"]


def test_an_allowlist_entry_for_the_agents_origin_still_opens_every_path(listeners, settings):
    v4, _ = listeners
    settings.EGRESS_ALLOWLIST = [f"127.0.0.1:{v4.port}"]
    settings.AGENT_BASE_URL = f"http://127.0.0.1:{v4.port}"
    assert _edge(v4.url("/admin/login/")) is None
    assert perform(HttpRequest("GET", v4.url("/admin/login/"), {}, None, 3000)).succeeded
    assert v4.connections == 1
