"""Egress policy: where an attempt may connect, decided on resolved addresses.

The host is resolved once, every address is checked, and the connection goes to the checked
address (Host header and TLS server name kept), so DNS rebinding cannot slip between the
check and the connect. Alternate address forms (`0x7f000001`, `2130706433`, `127.1`,
`[::ffff:127.0.0.1]`) resolve to the address they denote and are refused like it.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

# Ranges refused besides what `ipaddress` flags as non-global (named for clear messages).
_NAMED_RANGES: list[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network]] = [
    ("metadata", ipaddress.ip_network("169.254.169.254/32")),
    ("metadata", ipaddress.ip_network("fd00:ec2::254/128")),
    ("loopback", ipaddress.ip_network("127.0.0.0/8")),
    ("loopback", ipaddress.ip_network("::1/128")),
    ("unspecified", ipaddress.ip_network("0.0.0.0/8")),
    ("unspecified", ipaddress.ip_network("::/128")),
    ("private", ipaddress.ip_network("10.0.0.0/8")),
    ("private", ipaddress.ip_network("172.16.0.0/12")),
    ("private", ipaddress.ip_network("192.168.0.0/16")),
    ("carrier-grade NAT", ipaddress.ip_network("100.64.0.0/10")),
    ("link-local", ipaddress.ip_network("169.254.0.0/16")),
    ("link-local", ipaddress.ip_network("fe80::/10")),
    ("unique-local", ipaddress.ip_network("fc00::/7")),
    ("multicast", ipaddress.ip_network("224.0.0.0/4")),
    ("multicast", ipaddress.ip_network("ff00::/8")),
    ("reserved", ipaddress.ip_network("240.0.0.0/4")),
    ("benchmarking", ipaddress.ip_network("198.18.0.0/15")),
    ("documentation", ipaddress.ip_network("192.0.2.0/24")),
    ("documentation", ipaddress.ip_network("198.51.100.0/24")),
    ("documentation", ipaddress.ip_network("203.0.113.0/24")),
    ("documentation", ipaddress.ip_network("2001:db8::/32")),
    ("IETF protocol assignments", ipaddress.ip_network("192.0.0.0/24")),
    ("NAT64", ipaddress.ip_network("64:ff9b::/96")),
    ("6to4", ipaddress.ip_network("2002::/16")),
    ("Teredo", ipaddress.ip_network("2001::/32")),
]


class EgressDenied(Exception):
    """The target is not an address the agent may reach."""


def classify(address: IPAddress) -> str | None:
    """The name of the refused range `address` falls in, or None if it is public."""
    if isinstance(address, ipaddress.IPv6Address):
        # An IPv4 address wrapped in IPv6 is judged as the IPv4 address it carries.
        embedded = address.ipv4_mapped or _ipv4_compatible(address)
        if embedded is not None:
            return classify(embedded)
    for name, network in _NAMED_RANGES:
        if address.version == network.version and address in network:
            return name
    if not address.is_global or address.is_multicast or address.is_reserved:
        return "non-public"
    return None


def _ipv4_compatible(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    # Deprecated ::a.b.c.d form: the top 96 bits are zero.
    if int(address) >> 32 == 0 and int(address) > 1:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True)
class AllowRule:
    host: str | None = None
    port: int | None = None
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None

    def matches(self, host: str, port: int, address: IPAddress) -> bool:
        if self.network is not None:
            if address.version == self.network.version and address in self.network:
                return self.port is None or self.port == port
            mapped = getattr(address, "ipv4_mapped", None)
            return mapped is not None and mapped in self.network and (self.port is None or self.port == port)
        if self.host is not None and self.host == host.lower().rstrip("."):
            return self.port is None or self.port == port
        return False


def parse_allow_rule(entry: str) -> AllowRule:
    """`host`, `host:port`, `[v6]:port`, an address, or a CIDR; raises ValueError."""
    entry = entry.strip()
    if not entry:
        raise ValueError("empty allowlist entry")
    try:
        return AllowRule(network=ipaddress.ip_network(entry, strict=False))
    except ValueError:
        pass
    host, port = entry, None
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise ValueError(f"bad allowlist entry {entry!r}")
        host, rest = entry[1:close], entry[close + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"bad allowlist entry {entry!r}")
            port = int(rest[1:])
    elif entry.count(":") == 1:
        host, raw_port = entry.split(":")
        port = int(raw_port)
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"bad port in allowlist entry {entry!r}")
    try:
        address = ipaddress.ip_address(host)
        return AllowRule(network=ipaddress.ip_network(address), port=port)
    except ValueError:
        return AllowRule(host=host.lower().rstrip("."), port=port)


def _system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written in the URL (for Host and TLS server name)
    port: int
    address: str  # the checked address the connection goes to

    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


@dataclass
class EgressPolicy:
    rules: list[AllowRule] = field(default_factory=list)
    resolver: Resolver = _system_resolver

    @classmethod
    def from_settings(cls) -> EgressPolicy:
        rules = [parse_allow_rule(entry) for entry in settings.EGRESS_ALLOWLIST]
        rules.extend(own_mock_target_rules())
        return cls(rules=rules)

    def is_allowed(self, host: str, port: int, address: IPAddress) -> bool:
        return any(rule.matches(host, port, address) for rule in self.rules)

    def check_address(self, host: str, port: int, address: str | IPAddress) -> IPAddress:
        """The decision on one resolved address; raises EgressDenied."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            raise EgressDenied(f"scoped IPv6 address {ip} is refused")
        reason = classify(ip)
        if reason is not None and not self.is_allowed(host, port, ip):
            raise EgressDenied(f"{host} resolves to {ip}, a {reason} address; not in EGRESS_ALLOWLIST")
        return ip

    def resolve(self, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise EgressDenied(f"scheme {parts.scheme!r} is refused; only http and https")
        host = parts.hostname
        if not host:
            raise EgressDenied("the URL names no host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = self.resolver(host, port)
        if not addresses:
            raise OSError(f"{host} has no address")
        # Every address must pass: a name answering both a public and a private address
        # could otherwise be steered to the private one.
        checked = [self.check_address(host, port, address) for address in addresses]
        return Target(scheme=parts.scheme, host=host, port=port, address=str(checked[0]))


def own_mock_target_rules() -> Iterable[AllowRule]:
    """The embedded default may call its own mock target (SPEC §11)."""
    base = urlsplit(settings.AGENT_BASE_URL)
    if base.hostname and base.port:
        yield parse_allow_rule(f"{base.hostname}:{base.port}" if ":" not in base.hostname
                               else f"[{base.hostname}]:{base.port}")
        if base.hostname in ("localhost", "127.0.0.1", "::1"):
            yield AllowRule(network=ipaddress.ip_network("127.0.0.1/32"), port=base.port)
            yield AllowRule(network=ipaddress.ip_network("::1/128"), port=base.port)


# --- Connections pinned to the checked address -----------------------------------------------

_attempt = threading.local()


def track_sockets() -> list[socket.socket]:
    """Start collecting the sockets this thread opens (closed by the attempt's deadline)."""
    _attempt.sockets = []
    return _attempt.sockets


def _register(sock: socket.socket | None) -> None:
    sockets = getattr(_attempt, "sockets", None)
    if sockets is not None and sock is not None:
        sockets.append(sock)


class _TrackedHTTPConnection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _register(self.sock)


class _TrackedHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _register(self.sock)


class _TrackingPoolMixin:
    def _get_conn(self, timeout=None):
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        _register(conn.sock)  # a kept-alive connection is bounded by the deadline too
        return conn


class _PinnedHTTPPool(_TrackingPoolMixin, HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _PinnedHTTPSPool(_TrackingPoolMixin, HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


class PinnedAdapter(HTTPAdapter):
    """A requests adapter that checks the egress policy and connects to the checked address."""

    policy: EgressPolicy | None = None

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _PinnedHTTPPool, "https": _PinnedHTTPSPool}

    def get_connection_with_tls_context(self, request, verify, proxies=None, cert=None):
        policy = getattr(_attempt, "policy", None) or EgressPolicy.from_settings()
        target = policy.resolve(request.url)
        request.headers["Host"] = target.host_header()
        pool_kwargs: dict[str, object] = {}
        if target.scheme == "https":
            _, pool_kwargs = self.build_connection_pool_key_attributes(request, verify, cert)
            pool_kwargs = dict(pool_kwargs)
            # TLS is verified against the name in the URL, not the pinned address.
            pool_kwargs["server_hostname"] = target.host
            pool_kwargs["assert_hostname"] = target.host
        return self.poolmanager.connection_from_host(
            target.address, port=target.port, scheme=target.scheme, pool_kwargs=pool_kwargs
        )


def use_policy(policy: EgressPolicy | None) -> None:
    """Set the policy the adapter applies in this thread (None: from settings)."""
    _attempt.policy = policy
