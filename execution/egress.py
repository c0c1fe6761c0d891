"""Egress policy: where an attempt may connect, decided on resolved addresses.

The host is resolved once, every address is checked, and the connection goes to the checked
address (Host header and TLS server name kept), so DNS rebinding cannot slip between the
check and the connect: urllib3 is handed the address, never the name, and resolves nothing.
Alternate address forms (`0x7f000001`, `2130706433`, `017700000001`, `127.1`,
`[::ffff:127.0.0.1]`) are parsed like the C library parses them and refused like the address
they denote. The agent's own origin (AGENT_BASE_URL) is allowed under `/mock/` only, judged
on the path as the client sends it. See docs/security.md §2. The connections themselves are
execution/transport.py's.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

# Ranges refused, named for clear messages. `classify` also refuses whatever `ipaddress` does
# not consider global, so this list is about naming, and about ranges it would let through.
_NAMED_RANGES: list[tuple[str, IPNetwork]] = [
    (name, ipaddress.ip_network(cidr))
    for name, cidr in [
        ("metadata", "169.254.169.254/32"),
        ("metadata", "fd00:ec2::254/128"),
        ("loopback", "127.0.0.0/8"),
        ("loopback", "::1/128"),
        ("unspecified", "0.0.0.0/8"),
        ("unspecified", "::/128"),
        ("private", "10.0.0.0/8"),
        ("private", "172.16.0.0/12"),
        ("private", "192.168.0.0/16"),
        ("carrier-grade NAT", "100.64.0.0/10"),
        ("link-local", "169.254.0.0/16"),
        ("link-local", "fe80::/10"),
        ("unique-local", "fc00::/7"),
        ("site-local", "fec0::/10"),
        ("multicast", "224.0.0.0/4"),
        ("multicast", "ff00::/8"),
        ("broadcast", "255.255.255.255/32"),
        ("reserved", "240.0.0.0/4"),
        ("benchmarking", "198.18.0.0/15"),
        ("benchmarking", "2001:2::/48"),
        ("documentation", "192.0.2.0/24"),
        ("documentation", "198.51.100.0/24"),
        ("documentation", "203.0.113.0/24"),
        ("documentation", "2001:db8::/32"),
        ("IETF protocol assignments", "192.0.0.0/24"),
        ("6to4 relay", "192.88.99.0/24"),
        ("discard-only", "100::/64"),
        # Translation prefixes can carry any IPv4 address, a private one included.
        ("NAT64", "64:ff9b::/96"),
        ("NAT64", "64:ff9b:1::/48"),
        ("IPv4-translated", "::ffff:0:0:0/96"),
        ("6to4", "2002::/16"),
        ("Teredo", "2001::/32"),
    ]
]

# Headers the agent sets itself, hop-by-hop headers, and headers that would let a caller
# smuggle a second request or steer a proxy (docs/security.md §1). `Proxy-*` is refused as a prefix.
REFUSED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "trailers",
        "upgrade",
        # Set on every attempt of a service call, so a receiver can de-duplicate (docs/retries.md).
        "x-service-call-id",
        "x-service-call-attempt",
    }
)


class EgressDenied(Exception):
    """The target is not an address the agent may reach."""


def default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def header_key(name: str) -> str:
    """A header name as receivers compare it: case-insensitively, and with "_" and "-" the same
    (WSGI and CGI servers hand both spellings over as one HTTP_X_SERVICE_CALL_ID, so a
    receiver sees `X_Service_Call_Id` merged with `X-Service-Call-Id`; docs/security.md,
    "Header names")."""
    return name.strip().lower().replace("_", "-")


def refused_header(name: str) -> bool:
    key = header_key(name)
    return key in REFUSED_HEADERS or key.startswith("proxy-")


@lru_cache(maxsize=4096)
def classify(address: IPAddress) -> str | None:
    """The name of the refused range `address` falls in, or None if it is public. Remembered:
    a pure function of the address, and a public one is compared with every range."""
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
    # Deprecated ::a.b.c.d form: the top 96 bits are zero (:: and ::1 are named ranges).
    if int(address) >> 32 == 0 and int(address) > 1:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _unwrap(address: IPAddress) -> IPAddress:
    """`::ffff:a.b.c.d` is connected to (and matched) as `a.b.c.d`."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


_INET_ATON = re.compile(r"[0-9a-fA-FxX.]+")


def _inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address the C library's inet_aton reads in `host` (1-4 parts; each decimal,
    0-prefixed octal or 0x-prefixed hex; the last part fills the remaining bytes), or None.
    Written out rather than calling socket.inet_aton, which accepts trailing garbage."""
    if not _INET_ATON.fullmatch(host):
        return None
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        try:
            if part[:2].lower() == "0x":
                values.append(int(part[2:], 16))  # "0x" alone raises: not an address
            elif len(part) > 1 and part[0] == "0":
                values.append(int(part[1:], 8))
            else:
                values.append(int(part, 10))
        except ValueError:
            return None
    *leading, last = values
    if any(v > 0xFF for v in leading) or last >= 1 << (8 * (4 - len(leading))):
        return None
    number = 0
    for v in leading:
        number = number << 8 | v
    return ipaddress.IPv4Address(number << (8 * (4 - len(leading))) | last)


@lru_cache(maxsize=4096)
def parse_ip_literal(host: str) -> IPAddress | None:
    """The address `host` denotes if it is an IP literal in any form the resolver would
    accept (dotted, shortened, octal, hex, decimal, IPv6 with or without brackets).
    Remembered (pure; addresses are immutable)."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return _inet_aton(host)


def normalize_host(host: str) -> str:
    """The host as requests will send it: lower case, IDNA-encoded when not ASCII (so
    `１２７.０.０.１` becomes `127.0.0.1` here, as it will on the wire). Raises ValueError."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    if not host.isascii():
        import idna

        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise ValueError(f"the host is not a valid international name ({exc})") from None
    return host


@lru_cache(maxsize=1024)
def _client_url(url: str) -> str:
    """`url` as requests will send it; raises ValueError. Remembered: a submission judges its
    URL's host and path several times (validation, the egress check, flow control's host)."""
    from requests.exceptions import RequestException
    from requests.models import PreparedRequest

    prepared = PreparedRequest()
    try:
        prepared.prepare_url(url, None)
        return prepared.url or ""
    except (RequestException, ValueError, UnicodeError):
        raise ValueError("the host is not a valid name or address") from None


def client_url(url: str) -> str:
    """`url` as the HTTP client sends it (`_client_url`, remembered), or, for a URL it cannot
    send, the error requests itself raises (InvalidURL, MissingSchema: what an attempt reports)."""
    try:
        return _client_url(url)
    except ValueError:
        pass
    from requests.models import PreparedRequest

    prepared = PreparedRequest()
    prepared.prepare_url(url, None)  # raises requests' own error
    return prepared.url or ""


def client_host(url: str) -> str:
    """The host the HTTP client will use for `url`: requests (with urllib3) decodes percent
    escapes in the host, lower-cases it and IDNA-encodes it, so `http://%31%32%37.0.0.1/`
    goes to 127.0.0.1. The edge judges this host, as execution will. Raises ValueError."""
    return urlsplit(_client_url(url)).hostname or ""


# Escaped ".", "/", "\" or "%": a server, or a proxy before it, that decodes them reads
# another path than the one judged.
_DISGUISED_PATH = re.compile(r"%(2e|2f|5c|25)", re.IGNORECASE)


@lru_cache(maxsize=1024)
def client_path(*, url: str) -> str | None:
    """The path the HTTP client will send for `url`, or None when it is not plain: a dot
    segment, a backslash, or an escaped ".", "/", "\\" or "%", in the URL as written or as
    sent. Refused rather than normalised: requests removes dot segments and *then* decodes
    `%2e`, so `/mock/%2e%2e/admin/` goes out as `/mock/../admin/`, and what a server makes of
    that is its own business (docs/security.md §2). Remembered (pure)."""
    try:
        written = urlsplit(url).path
        sent = urlsplit(_client_url(url)).path or "/"
    except ValueError:
        return None
    for path in (written, sent):
        if "\\" in path or _DISGUISED_PATH.search(path):
            return None
        if any(segment in (".", "..") for segment in path.split("/")):
            return None
    return sent


@dataclass(frozen=True)
class AllowRule:
    host: str | None = None
    port: int | None = None
    network: IPNetwork | None = None
    # "*.example.com": any name below example.com (not example.com itself).
    suffix: str | None = None
    # Only paths under this prefix (client_path); an unknown or disguised path never matches.
    path_prefix: str | None = None

    def matches(self, host: str, port: int, address: IPAddress, path: str | None = None) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.path_prefix is not None and (path is None or not path.startswith(self.path_prefix)):
            return False
        if self.network is not None:
            address = _unwrap(address)
            return address.version == self.network.version and address in self.network
        name = host.lower().rstrip(".")
        if self.host is not None:
            return self.host == name
        if self.suffix is not None:
            return name.endswith("." + self.suffix)
        return False


def parse_allow_rule(entry: str) -> AllowRule:
    """`host`, `host:port`, `*.domain`, `[v6]:port`, an address, or a CIDR; raises ValueError."""
    entry = entry.strip()
    if not entry:
        raise ValueError("empty allowlist entry")
    if "/" not in entry and "://" not in entry:
        literal = parse_ip_literal(entry)
        if literal is not None:
            return AllowRule(network=ipaddress.ip_network(_unwrap(literal)))
    try:
        return AllowRule(network=ipaddress.ip_network(entry, strict=False))
    except ValueError:
        pass
    if "://" in entry or "/" in entry or "@" in entry:
        raise ValueError(f"bad allowlist entry {entry!r}: give a host, host:port or CIDR, not a URL")
    host, port = entry, None
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise ValueError(f"bad allowlist entry {entry!r}")
        host, rest = entry[1:close], entry[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"bad allowlist entry {entry!r}")
            port = _port(rest[1:], entry)
    elif entry.count(":") == 1:
        host, raw_port = entry.split(":")
        port = _port(raw_port, entry)
    elif ":" in entry:
        raise ValueError(f"bad allowlist entry {entry!r}: write IPv6 addresses with a port as [addr]:port")
    literal = parse_ip_literal(host)
    if literal is not None:
        return AllowRule(network=ipaddress.ip_network(_unwrap(literal)), port=port)
    host = normalize_host(host).rstrip(".")
    if host.startswith("*."):
        suffix = host[2:]
        if not suffix or "*" in suffix:
            raise ValueError(f"bad allowlist entry {entry!r}")
        return AllowRule(suffix=suffix, port=port)
    if not host or "*" in host or not re.fullmatch(r"[a-z0-9_.-]+", host):
        raise ValueError(f"bad allowlist entry {entry!r}")
    return AllowRule(host=host, port=port)


def _port(raw: str, entry: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError(f"bad port in allowlist entry {entry!r}")
    return int(raw)


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written in the URL, normalized (for Host and TLS server name)
    port: int
    address: str  # the checked address the connection goes to

    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default_port(self.scheme) else f"{host}:{self.port}"


@lru_cache(maxsize=1024)
def host_header(*, url: str) -> str:
    """The Host header sent for `url`: the name from the URL, whatever address the
    connection is pinned to. Raises ValueError. Remembered (pure)."""
    parts = urlsplit(url)
    port = parts.port or default_port(parts.scheme)
    return Target(scheme=parts.scheme, host=client_host(url), port=port, address="").host_header()


@dataclass
class EgressPolicy:
    rules: list[AllowRule] = field(default_factory=list)
    # Tests hand in a resolver; None is the system's (execution/transport.py asks it, bounded
    # by the attempt's deadline).
    resolver: Resolver | None = None

    @classmethod
    def from_settings(cls) -> EgressPolicy:
        # Parsed once per configuration, not once per attempt (the key follows the settings,
        # so a changed allowlist takes effect at once). A copy: a caller that changes its
        # policy (a test's resolver, an extra rule) must not change everyone's.
        cached = _policy_for(tuple(settings.EGRESS_ALLOWLIST), settings.AGENT_BASE_URL)
        return EgressPolicy(rules=list(cached.rules), resolver=cached.resolver)

    def is_allowed(self, host: str, port: int, address: IPAddress, path: str | None = None) -> bool:
        return any(rule.matches(host, port, address, path) for rule in self.rules)

    def check_address(self, host: str, port: int, address: str | IPAddress, *, path: str | None = None) -> IPAddress:
        """The decision on one resolved address, for a request to `path` (client_path; None:
        unknown, so no path-bound rule applies); raises EgressDenied. Returns the address to
        connect to (an IPv4-mapped IPv6 address as the IPv4 address it carries)."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        # A refusal names the class of the address, never the address: a tenant reads it (in a
        # 400, a call's errorMeta, a delivery's lastError) and could otherwise map the names
        # of the operator's network to its addresses (docs/security.md, "Refusals name no
        # address").
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            raise EgressDenied("a scoped IPv6 address (with a zone) is refused")
        reason = classify(ip)
        if reason is not None and not self.is_allowed(host, port, ip, path):
            shown = host if parse_ip_literal(host) is None else "the URL"
            message = f"{shown} points to {_with_article(reason)} address, not in EGRESS_ALLOWLIST"
            bound = [
                r.path_prefix
                for r in self.rules
                if r.path_prefix and replace(r, path_prefix=None).matches(host, port, ip)
            ]
            if bound:
                message += f" (on the agent's own origin only paths under {bound[0]} are allowed)"
            raise EgressDenied(message)
        return _unwrap(ip)

    def literal_refusal(self, url: str) -> str | None:
        """Why a URL whose host is an IP literal (in any form) is refused, or None: lets the
        edge answer 400 at once. A host name is only judged when the call runs."""
        try:
            parts = urlsplit(url)
            port = parts.port or default_port(parts.scheme)
            host = client_host(url)
        except ValueError:
            return None
        literal = parse_ip_literal(host)
        if literal is None:
            return None
        try:
            self.check_address(host, port, literal, path=client_path(url=url))
        except EgressDenied as exc:
            return str(exc)
        return None

    def resolve(self, url: str, *, lookup: Resolver | None = None) -> Target:
        """Resolve the URL's host once (with `lookup`, else the policy's resolver) and check
        every address; raises EgressDenied, or whatever the lookup raises (OSError when the
        name does not resolve)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise EgressDenied(f"the scheme {parts.scheme!r} is refused; only http and https")
        try:
            port = parts.port or default_port(parts.scheme)
            host = client_host(url)  # what requests made of the URL (idempotent on its own)
        except ValueError as exc:
            raise EgressDenied(f"the URL is malformed: {exc}") from None
        if not host:
            raise EgressDenied("the URL names no host")
        literal = parse_ip_literal(host)
        # A literal is never handed to a resolver: what is checked is what it denotes.
        addresses: list[str | IPAddress] = (
            [literal] if literal is not None else _lookup(lookup or self.resolver, host, port)
        )
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} has no address")
        # Every address must pass: a name answering both a public and a private address
        # could otherwise be steered to the private one.
        path = client_path(url=url)
        checked = [self.check_address(host, port, address, path=path) for address in addresses]
        return Target(scheme=parts.scheme, host=host, port=port, address=str(checked[0]))


def _with_article(reason: str) -> str:
    """ "a loopback", "an unspecified", "an IETF protocol assignments", "a unique-local"."""
    article = "an" if reason[0] in "aeiouAEIOU" and not reason.startswith("uni") else "a"
    return f"{article} {reason}"


def _lookup(resolver: Resolver | None, host: str, port: int) -> list[str]:
    if resolver is None:
        raise RuntimeError("no resolver: execution/transport.py resolves for attempts")
    return resolver(host, port)


@lru_cache(maxsize=8)
def _policy_for(allowlist: tuple[str, ...], agent_base_url: str) -> EgressPolicy:
    rules = [parse_allow_rule(entry) for entry in allowlist]
    rules.extend(own_mock_target_rules(agent_base_url))
    return EgressPolicy(rules=rules)


def own_mock_target_rules(agent_base_url: str) -> Iterable[AllowRule]:
    """The agent may call its own mock target (docs/security.md §2): paths under `/mock/` on
    the host and port of AGENT_BASE_URL (and on the loopback addresses, on that port, when it
    names this machine). Its API, admin and /metrics on the same origin stay refused."""
    try:
        base = urlsplit(agent_base_url)
        port = base.port or default_port(base.scheme)
    except ValueError:
        return
    host = base.hostname
    if not host:
        return
    # The mock is mounted at "mock/" of the URLconf, below any path the base URL has.
    prefix = base.path.rstrip("/") + "/mock/"
    literal = parse_ip_literal(host)
    if literal is not None:
        yield AllowRule(network=ipaddress.ip_network(_unwrap(literal)), port=port, path_prefix=prefix)
    else:
        yield AllowRule(host=host.lower().rstrip("."), port=port, path_prefix=prefix)
    if host in ("localhost", "127.0.0.1", "::1"):
        yield AllowRule(network=ipaddress.ip_network("127.0.0.1/32"), port=port, path_prefix=prefix)
        yield AllowRule(network=ipaddress.ip_network("::1/128"), port=port, path_prefix=prefix)
