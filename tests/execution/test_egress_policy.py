"""The egress decision (docs/security.md §2), at the decision level only: no address here is connected to.

Every refused range is covered with IPv4, IPv6 and IPv4-mapped samples; alternate address
forms are parsed as the C library parses them; the allowlist opens exceptions by host,
host:port, CIDR or domain suffix. The agent's own origin: test_egress_own_origin.py.
"""

from __future__ import annotations

import ipaddress
import socket
import sys

import pytest

from execution.egress import (
    AllowRule,
    EgressDenied,
    EgressPolicy,
    classify,
    client_host,
    parse_allow_rule,
    parse_ip_literal,
)

REFUSED = [
    # (address, the range's name in the message)
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("::1", "loopback"),
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "unspecified"),
    ("::", "unspecified"),
    ("10.0.0.1", "private"),
    ("10.255.255.255", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.254", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("100.127.255.254", "carrier-grade NAT"),
    ("169.254.169.254", "metadata"),
    ("fd00:ec2::254", "metadata"),
    ("169.254.0.1", "link-local"),
    ("fe80::1", "link-local"),
    ("febf:ffff::1", "link-local"),
    ("fc00::1", "unique-local"),
    ("fd00::1", "unique-local"),
    ("fd12:3456:789a::1", "unique-local"),
    ("fec0::1", "site-local"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("ff02::1", "multicast"),
    ("ff05::2", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("240.0.0.1", "reserved"),
    ("250.1.2.3", "reserved"),
    ("198.18.0.1", "benchmarking"),
    ("192.0.2.1", "documentation"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("2001:db8::1", "documentation"),
    ("192.0.0.8", "IETF protocol assignments"),
    ("64:ff9b::a00:1", "NAT64"),
    ("2002:7f00:1::", "6to4"),
    ("2001:0:4136:e378::1", "Teredo"),
    ("100::1", "discard-only"),
    # IPv4 inside IPv6 is judged as the IPv4 address it carries.
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:10.1.2.3", "private"),
    ("::ffff:169.254.169.254", "metadata"),
    ("::ffff:100.64.0.1", "carrier-grade NAT"),
    ("::ffff:192.168.0.1", "private"),
    ("::127.0.0.1", "loopback"),
    ("::ffff:0:7f00:1", "IPv4-translated"),
]

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "2606:4700:4700::1111",
    "2a00:1450:4001::200e",
    "::ffff:8.8.8.8",
    "100.128.0.1",
    "172.32.0.1",
    "192.169.0.1",
]


@pytest.fixture
def policy(settings) -> EgressPolicy:
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = "http://agent.test:8000"
    return EgressPolicy.from_settings()


@pytest.mark.parametrize(("address", "reason"), REFUSED)
def test_it_refuses_every_non_public_range(policy, address, reason):
    assert classify(ipaddress.ip_address(address)) == reason
    with pytest.raises(EgressDenied, match=reason):
        policy.check_address("example.com", 80, address)


@pytest.mark.parametrize("address", PUBLIC)
def test_it_lets_public_addresses_through(policy, address):
    assert classify(ipaddress.ip_address(address)) is None
    checked = policy.check_address("example.com", 443, address)
    # A mapped address is connected to as the IPv4 address it carries.
    assert str(checked) == address.removeprefix("::ffff:")


def test_it_refuses_scoped_ipv6_addresses(policy):
    with pytest.raises(EgressDenied, match="scoped"):
        policy.check_address("example.com", 80, "fe80::1%eth0")


ALTERNATE_FORMS = [
    ("127.0.0.1", "127.0.0.1"),
    ("127.1", "127.0.0.1"),
    ("127.0.1", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("0X7F000001", "127.0.0.1"),
    ("2130706433", "127.0.0.1"),
    ("017700000001", "127.0.0.1"),
    ("0x7f.0x0.0x0.0x1", "127.0.0.1"),
    ("0177.0.0.01", "127.0.0.1"),
    ("127.000.000.001", "127.0.0.1"),
    ("0x7f.1", "127.0.0.1"),
    ("0", "0.0.0.0"),
    ("0xa9fea9fe", "169.254.169.254"),
    ("2852039166", "169.254.169.254"),
    ("169.254.43518", "169.254.169.254"),
    ("012.1", "10.0.0.1"),
    ("::1", "::1"),
    ("[::1]", "::1"),
    ("0:0:0:0:0:0:0:1", "::1"),
    ("::ffff:127.0.0.1", "::ffff:7f00:1"),
    ("::ffff:7f00:1", "::ffff:7f00:1"),
]


@pytest.mark.parametrize(("text", "address"), ALTERNATE_FORMS)
def test_it_reads_alternate_address_forms_as_the_address_they_denote(text, address):
    assert parse_ip_literal(text) == ipaddress.ip_address(address)


@pytest.mark.parametrize(
    "text",
    [
        "example.com",
        "deadbeef",
        "0x",
        "1.2.3.4.5",
        "08.0.0.1",
        "4294967296",
        "127.0.0.256",
        "127.0.0.1.",
        "1..2",
        "",
        "localhost",
        "0x7g",
    ],
)
def test_it_reads_names_and_malformed_numbers_as_no_address(text):
    assert parse_ip_literal(text) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares with glibc's inet_aton")
@pytest.mark.parametrize("text", [t for t, a in ALTERNATE_FORMS if ":" not in t] + ["08.0.0.1", "4294967296", "0x"])
def test_it_agrees_with_the_c_library_on_ipv4_forms(text):
    try:
        expected = ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        expected = None
    assert parse_ip_literal(text) == expected


@pytest.mark.parametrize(
    "url",
    [
        "http://0x7f000001/",
        "http://2130706433/",
        "http://017700000001/",
        "http://127.1/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::1]/",
        "http://100.64.0.1/",
        "http://[fd00::1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://0xa9fea9fe/",
        "http://[::ffff:a9fe:a9fe]/",
        "http://%31%32%37.0.0.1/",
        "https://10.0.0.1:8443/",
        "http://0/",
    ],
)
def test_it_refuses_literal_addresses_without_asking_a_resolver(policy, url):
    asked = []
    policy.resolver = lambda host, port: asked.append(host) or ["8.8.8.8"]
    with pytest.raises(EgressDenied):
        policy.resolve(url)
    assert policy.literal_refusal(url) is not None
    assert asked == []


def test_it_judges_a_name_by_every_address_it_resolves_to(policy):
    policy.resolver = lambda host, port: ["8.8.8.8", "10.0.0.7"]
    with pytest.raises(EgressDenied, match="split.example points to a private address"):
        policy.resolve("http://split.example/")
    policy.resolver = lambda host, port: ["8.8.8.8", "2606:4700:4700::1111"]
    target = policy.resolve("http://public.example:8080/x")
    assert (target.host, target.port, target.address) == ("public.example", 8080, "8.8.8.8")
    assert target.host_header() == "public.example:8080"


def test_it_resolves_a_name_once_and_pins_the_checked_address(policy):
    answers = iter([["8.8.4.4"], ["127.0.0.1"]])
    calls = []

    def rebinding(host, port):
        calls.append(host)
        return next(answers)

    policy.resolver = rebinding
    assert policy.resolve("https://rebind.example/").address == "8.8.4.4"
    assert calls == ["rebind.example"]
    with pytest.raises(EgressDenied, match="loopback"):  # the next attempt sees the new answer
        policy.resolve("https://rebind.example/")


def test_it_connects_to_a_mapped_answer_as_plain_ipv4(policy):
    policy.rules.append(parse_allow_rule("8.8.8.0/24"))
    policy.resolver = lambda host, port: ["::ffff:8.8.8.8"]
    assert policy.resolve("http://mapped.example/").address == "8.8.8.8"


def test_a_name_that_resolves_to_nothing_is_a_resolution_error(policy):
    policy.resolver = lambda host, port: []
    with pytest.raises(socket.gaierror):
        policy.resolve("http://empty.example/")


@pytest.mark.parametrize("url", ["ftp://example.com/", "file:///etc/passwd", "gopher://x/", "http:///nohost"])
def test_it_refuses_other_schemes_and_missing_hosts(policy, url):
    with pytest.raises(EgressDenied):
        policy.resolve(url)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://%31%32%37.0.0.1/", "127.0.0.1"),
        ("http://LocalHost:80/", "localhost"),
        ("http://bücher.example/", "xn--bcher-kva.example"),
        ("http://[::FFFF:7F00:1]/", "::ffff:7f00:1"),
    ],
)
def test_the_edge_judges_the_host_the_client_will_connect_to(url, host):
    assert client_host(url) == host


@pytest.mark.parametrize(
    "url", ["http://１２７.０.０.１/", "http://127。0。0。1/", "http://*.example/", "http://[::1/"]
)
def test_hosts_the_client_cannot_encode_are_invalid(url):
    with pytest.raises(ValueError):
        client_host(url)


def test_a_name_literal_is_not_judged_at_submission(policy):
    assert policy.literal_refusal("http://localhost:9/") is None
    assert policy.literal_refusal("http://example.com/") is None
    assert policy.literal_refusal("http://8.8.8.8/") is None


# --- The allowlist --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        ("example.com", AllowRule(host="example.com")),
        ("Example.COM.", AllowRule(host="example.com")),
        ("example.com:8080", AllowRule(host="example.com", port=8080)),
        ("*.internal.example", AllowRule(suffix="internal.example")),
        ("*.internal.example:443", AllowRule(suffix="internal.example", port=443)),
        ("10.0.0.0/8", AllowRule(network=ipaddress.ip_network("10.0.0.0/8"))),
        ("10.1.2.3", AllowRule(network=ipaddress.ip_network("10.1.2.3/32"))),
        ("10.1.2.3:8080", AllowRule(network=ipaddress.ip_network("10.1.2.3/32"), port=8080)),
        ("::1", AllowRule(network=ipaddress.ip_network("::1/128"))),
        ("[::1]:8000", AllowRule(network=ipaddress.ip_network("::1/128"), port=8000)),
        ("fd00::/8", AllowRule(network=ipaddress.ip_network("fd00::/8"))),
        ("0x7f000001", AllowRule(network=ipaddress.ip_network("127.0.0.1/32"))),
        ("bücher.example", AllowRule(host="xn--bcher-kva.example")),
    ],
)
def test_it_parses_allowlist_entries(entry, rule):
    assert parse_allow_rule(entry) == rule


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "  ",
        "http://example.com",
        "example.com:0",
        "example.com:70000",
        "example.com:http",
        "[::1",
        "[::1]8000",
        "[fe80::1]:x",
        "1.2.3.4:80:90",
        "*.",
        "a*.example",
        "example.com/path",
        "user@example.com",
        "exa mple.com",
    ],
)
def test_it_refuses_malformed_allowlist_entries(entry):
    with pytest.raises(ValueError):
        parse_allow_rule(entry)


def test_an_allowed_cidr_opens_its_range_and_nothing_more(settings):
    settings.EGRESS_ALLOWLIST = ["10.20.0.0/16", "fd00:1::/32"]
    settings.AGENT_BASE_URL = "http://agent.test:8000"
    policy = EgressPolicy.from_settings()
    assert str(policy.check_address("svc", 80, "10.20.3.4")) == "10.20.3.4"
    assert str(policy.check_address("svc", 80, "::ffff:10.20.3.4")) == "10.20.3.4"
    assert str(policy.check_address("svc", 80, "fd00:1::5")) == "fd00:1::5"
    for address in ["10.21.0.1", "127.0.0.1", "fd00:2::5", "169.254.169.254"]:
        with pytest.raises(EgressDenied):
            policy.check_address("svc", 80, address)


def test_an_allowed_host_port_opens_that_port_only(settings):
    settings.EGRESS_ALLOWLIST = ["db.internal:5984", "127.0.0.1:7000"]
    settings.AGENT_BASE_URL = "http://agent.test:8000"
    policy = EgressPolicy.from_settings()
    assert str(policy.check_address("db.internal", 5984, "10.0.0.5")) == "10.0.0.5"
    assert str(policy.check_address("DB.internal.", 5984, "10.0.0.5")) == "10.0.0.5"
    assert str(policy.check_address("127.0.0.1", 7000, "127.0.0.1")) == "127.0.0.1"
    with pytest.raises(EgressDenied):
        policy.check_address("db.internal", 5985, "10.0.0.5")
    with pytest.raises(EgressDenied):
        policy.check_address("other.internal", 5984, "10.0.0.5")
    with pytest.raises(EgressDenied):
        policy.check_address("127.0.0.1", 7001, "127.0.0.1")


def test_a_suffix_rule_opens_names_below_the_domain(settings):
    settings.EGRESS_ALLOWLIST = ["*.corp.example"]
    settings.AGENT_BASE_URL = "http://agent.test:8000"
    policy = EgressPolicy.from_settings()
    assert str(policy.check_address("api.corp.example", 443, "10.0.0.5")) == "10.0.0.5"
    for host in ["corp.example", "evilcorp.example", "corp.example.evil.test"]:
        with pytest.raises(EgressDenied):
            policy.check_address(host, 443, "10.0.0.5")


# --- Refusals name the class of an address, never the address ---------------------------------


def test_it_refuses_a_name_resolving_to_loopback_without_echoing_the_address(policy):
    """`localhost` resolves on this machine (the system's resolver, as attempts use): the
    refusal says what kind of address it points to, and no address a tenant could map."""
    from execution.transport import system_resolver

    addresses = system_resolver("localhost", 80)
    assert addresses  # 127.0.0.1 and/or ::1
    with pytest.raises(EgressDenied) as refused:
        policy.resolve("http://localhost/", lookup=system_resolver)
    message = str(refused.value)
    assert message == "localhost points to a loopback address, not in EGRESS_ALLOWLIST"
    assert not any(address in message for address in [*addresses, "127.0.0.1", "::1"])


@pytest.mark.parametrize(("address", "reason"), REFUSED)
def test_it_names_no_resolved_address_in_a_refusal(policy, address, reason):
    policy.resolver = lambda host, port: [address]
    with pytest.raises(EgressDenied) as refused:
        policy.resolve("http://internal.example/")
    message = str(refused.value)
    assert message.startswith("internal.example points to a") and f"{reason} address" in message
    assert address not in message and str(ipaddress.ip_address(address)) not in message
    assert not any(ch.isdigit() for ch in message.replace("IPv4", "").replace("6to4", "").replace("NAT64", ""))


def test_it_names_no_address_for_a_literal_refused_at_the_edge(policy):
    for url in ("http://0x7f000001/", "http://[::ffff:10.1.2.3]/", "http://169.254.169.254/latest/"):
        refusal = policy.literal_refusal(url)
        assert refusal is not None and refusal.startswith("the URL points to a")
        assert not any(ch.isdigit() for ch in refusal), refusal


def test_a_scoped_ipv6_refusal_names_no_address(policy):
    policy.resolver = lambda host, port: ["fe80::1%2"]
    with pytest.raises(EgressDenied) as refused:
        policy.resolve("http://scoped.example/")
    assert "fe80" not in str(refused.value)
