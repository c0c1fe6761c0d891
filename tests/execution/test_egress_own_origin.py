"""The agent's own origin (AGENT_BASE_URL) is allowed under /mock/ only, at the decision level:
nothing here is connected to (tests/security/test_ssrf.py has the listeners).

The path is judged as the HTTP client sends it, and any path that a server could read
differently (dot segments, escaped dots, slashes, backslashes or percent signs) is refused.
"""

from __future__ import annotations

import pytest

from execution.egress import AllowRule, EgressDenied, EgressPolicy, client_path, own_mock_target_rules

OWN = "http://127.0.0.1:8000"

MOCK_PATHS = [
    "/mock/",
    "/mock/echo",
    "/mock/status/500",
    "/mock/delay/10?after=/../admin/",  # the query is not the path
    "/mock/json#/../../admin/",  # a fragment is never sent
    "/mock/caf%C3%A9",
    "/mock/café",
]

REFUSED_PATHS = [
    "",
    "/",
    "/admin/login/",
    "/metrics",
    "/healthz",
    "/api/v1/service-calls",
    "/mock",
    "/mockx/echo",
    "/MOCK/echo",
    "/Mock/echo",
    "//mock/echo",
    "/x/mock/echo",
    "/mock/../admin/",
    "/mock/./echo",
    "/x/../mock/echo",  # would land under /mock/, refused all the same
    "/mock/%2e%2e/admin/",
    "/mock/.%2E/admin/",
    "/mock/%2e/echo",
    "/mock%2F..%2Fadmin/",
    "/mock/..%2fadmin/",
    "/mock/%5c..%5cadmin/",
    "/mock/%252e%252e/admin/",
    "/mock\\..\\admin/",
]


@pytest.fixture
def own_origin_only(settings) -> EgressPolicy:
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = OWN
    return EgressPolicy.from_settings()


@pytest.mark.parametrize("path", MOCK_PATHS)
def test_the_mock_target_on_the_agents_own_origin_is_allowed(own_origin_only, path):
    target = own_origin_only.resolve(OWN + path)
    assert (target.address, target.port) == ("127.0.0.1", 8000)
    assert own_origin_only.literal_refusal(OWN + path) is None


@pytest.mark.parametrize("path", REFUSED_PATHS)
def test_every_other_path_of_the_agents_own_origin_is_refused(own_origin_only, path):
    with pytest.raises(EgressDenied, match="only paths under /mock/ are allowed"):
        own_origin_only.resolve(OWN + path)
    refusal = own_origin_only.literal_refusal(OWN + path)
    assert refusal is not None and "only paths under /mock/" in refusal


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("http://h/mock/echo?a=1", "/mock/echo"),
        ("http://h/mock/./echo", None),
        ("http://h/mock/%2e%2e/admin/", None),  # requests would send /mock/../admin/
        ("http://h/mock/a%2Fb", None),
        ("http://h", "/"),
        ("http://[::1/mock/", None),
    ],
)
def test_client_path_is_the_path_as_sent_or_none_when_disguised(url, path):
    assert client_path(url=url) == path


def test_a_host_name_resolving_to_the_agents_origin_is_judged_by_path_too(settings):
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = "http://agent.example.test:8000"
    policy = EgressPolicy.from_settings()
    policy.resolver = lambda host, port: ["10.0.0.9"]
    assert policy.resolve("http://agent.example.test:8000/mock/echo").address == "10.0.0.9"
    with pytest.raises(EgressDenied, match="only paths under /mock/"):
        policy.resolve("http://agent.example.test:8000/admin/login/")
    with pytest.raises(EgressDenied):
        policy.resolve("http://agent.example.test:8001/mock/echo")


def test_a_localhost_base_url_allows_the_mock_on_both_loopback_addresses(settings):
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = "http://localhost:8123"
    policy = EgressPolicy.from_settings()
    for address in ("127.0.0.1", "::1"):
        policy.resolver = lambda host, port, address=address: [address]
        assert policy.resolve("http://localhost:8123/mock/json").address == address
        with pytest.raises(EgressDenied):
            policy.resolve("http://localhost:8123/metrics")
    assert policy.literal_refusal("http://[::1]:8123/mock/json") is None
    assert policy.literal_refusal("http://[::1]:8123/admin/") is not None


def test_a_base_url_with_a_path_moves_the_mock_below_it(settings):
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = "https://agent.example.test/agent/"
    assert list(own_mock_target_rules(settings.AGENT_BASE_URL)) == [
        AllowRule(host="agent.example.test", port=443, path_prefix="/agent/mock/")
    ]
    policy = EgressPolicy.from_settings()
    policy.resolver = lambda host, port: ["10.0.0.9"]
    assert policy.resolve("https://agent.example.test/agent/mock/echo").port == 443
    with pytest.raises(EgressDenied):
        policy.resolve("https://agent.example.test/mock/echo")


def test_the_mock_target_without_a_port_is_allowed_on_the_default_port(settings):
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = "http://mock.internal"
    assert list(own_mock_target_rules(settings.AGENT_BASE_URL)) == [
        AllowRule(host="mock.internal", port=80, path_prefix="/mock/")
    ]
    policy = EgressPolicy.from_settings()
    assert str(policy.check_address("mock.internal", 80, "10.0.0.9", path="/mock/echo")) == "10.0.0.9"
    for port, path in [(8080, "/mock/echo"), (80, "/admin/"), (80, None)]:
        with pytest.raises(EgressDenied):
            policy.check_address("mock.internal", port, "10.0.0.9", path=path)


def test_the_mock_target_may_be_an_ipv6_literal(settings):
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = "https://[::1]:8443"
    policy = EgressPolicy.from_settings()
    assert policy.literal_refusal("https://[::1]:8443/mock/echo") is None
    assert policy.literal_refusal("https://[::1]:8443/admin/") is not None
    assert policy.literal_refusal("https://[::1]:8444/mock/echo") is not None


@pytest.mark.parametrize("entry", ["127.0.0.1:8000", "127.0.0.0/8"])
def test_an_explicit_allowlist_entry_still_allows_every_path(settings, entry):
    settings.EGRESS_ALLOWLIST = [entry]
    settings.AGENT_BASE_URL = OWN
    policy = EgressPolicy.from_settings()
    for path in ["/admin/login/", "/metrics", "/mock/../admin/", "/mock/echo"]:
        assert policy.literal_refusal(OWN + path) is None
        assert policy.resolve(OWN + path).address == "127.0.0.1"
