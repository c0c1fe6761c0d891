"""Flow control, the pure rules: a tenant's limits, their validation, and which calls may start
now (docs/flow-control.md). No database here; orchestration.admission applies these rules to
rows under locks.

A limit is `parallelism` (calls Running at once) and `ratePerSecond` (starts per second), each
optional, for the whole tenant and for each named target host. The rate is a GCRA with no
burst tolerance: a call starts at s = max(TAT, now) (TAT: the theoretical arrival time), and
then TAT = s + 1/rate. Consecutive starts are therefore at least 1/rate apart, so no 1-second
window holds more than `rate` starts. A call may be admitted up to LOOKAHEAD_SECONDS (and at
most MAX_AHEAD starts) before its start: it is then Running from its admission (it counts for
parallelism) but starts, and its request leaves, at s. Without that, every start would begin its successor's interval late
by however long the engine took to get to it, and a busy engine would keep a tenant well
below its rate.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from core.errors import ValidationFailed
from execution.egress import client_host

MAX_PARALLELISM = 1000
MAX_RATE = 1000.0
# One start every 1000 s at the slowest; a slower "rate" is a schedule, not a limit.
MIN_RATE = 0.001
MAX_HOSTS = 50
# How early a call may be admitted before its rate lets it start, at most; and how many calls
# may wait for their start under one rate at once (each in an execution thread), at most: a
# high rate looks ahead less (MAX_AHEAD / rate).
LOOKAHEAD_SECONDS = 0.1
MAX_AHEAD = 8
MAX_HOST_KEY = 262  # a 253-character name, ":", a 5-digit port, or an [IPv6] literal with a port

FIELDS = ("parallelism", "ratePerSecond", "hosts")
LIMIT_FIELDS = ("parallelism", "ratePerSecond")
TENANT_QUEUE = ""
DEFAULT_PORTS = {"http": 80, "https": 443}

_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")
# What an error may quote back as a field name: printable ASCII (no control characters, no
# lone surrogates, which no response could encode).
_PRINTABLE = re.compile(r"[\x20-\x7e]{1,200}\Z")


@dataclass(frozen=True)
class Limit:
    """One limit: None means unlimited."""

    parallelism: int | None = None
    rate: float | None = None

    @property
    def limited(self) -> bool:
        return self.parallelism is not None or self.rate is not None

    def as_wire(self) -> dict[str, Any]:
        return {"parallelism": self.parallelism, "ratePerSecond": self.rate}


@dataclass(frozen=True)
class FlowLimits:
    """A tenant's limits: its own, and per target host (`host[:port]`, lower case)."""

    tenant: Limit = Limit()
    hosts: dict[str, Limit] = field(default_factory=dict)

    @property
    def limited(self) -> bool:
        return self.tenant.limited or any(limit.limited for limit in self.hosts.values())

    def as_wire(self) -> dict[str, Any]:
        return {
            **self.tenant.as_wire(),
            "hosts": {host: self.hosts[host].as_wire() for host in sorted(self.hosts)},
        }

    def capped(self, *, parallelism: int | None, rate: float | None) -> FlowLimits:
        """These limits under the operator's ceilings (None: no ceiling): the tenant's own
        limit is the lower of its own and the ceiling (docs/flow-control.md, "Operator
        ceilings"); host limits apply on top, as ever."""

        def lower(own: Any, ceiling: Any) -> Any:
            return ceiling if own is None else own if ceiling is None else min(own, ceiling)

        if parallelism is None and rate is None:
            return self
        tenant = Limit(lower(self.tenant.parallelism, parallelism), lower(self.tenant.rate, rate))
        return FlowLimits(tenant=tenant, hosts=self.hosts)

    @classmethod
    def from_stored(cls, *, parallelism: int | None, rate: float | None, hosts: dict[str, Any] | None) -> FlowLimits:
        """From the columns of flow_controls (hosts stored in the wire shape)."""
        return cls(
            tenant=Limit(parallelism, rate),
            hosts={
                host: Limit(value.get("parallelism"), value.get("ratePerSecond"))
                for host, value in (hosts or {}).items()
            },
        )


UNLIMITED = FlowLimits()


# --- Validation (every edge: API, dashboard, admin) ---------------------------------------------


def _parallelism_error(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"Must be a whole number from 1 to {MAX_PARALLELISM}, or null for no limit."
    if not 1 <= value <= MAX_PARALLELISM:
        return f"Must be from 1 to {MAX_PARALLELISM} (or null for no limit)."
    return None


def _rate_error(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"Must be a number from {MIN_RATE:g} to {MAX_RATE:g} (starts per second), or null for no limit."
    if not MIN_RATE <= value <= MAX_RATE:
        return f"Must be from {MIN_RATE:g} to {MAX_RATE:g} starts per second (or null for no limit)."
    return None


def _limit(raw: Any, where: str, errors: dict[str, list[str]]) -> Limit:
    """One `{parallelism, ratePerSecond}` object; `where` prefixes the field names ('' at the top)."""
    if not isinstance(raw, dict):
        errors.setdefault(where, []).append("Must be an object {parallelism, ratePerSecond}.")
        return Limit()
    allowed = LIMIT_FIELDS if where else FIELDS
    for key in sorted(str(key) for key in raw if key not in allowed):
        shown = key if _PRINTABLE.match(key) else None
        name = (f"{where}.{shown}" if where else shown) if shown else (where or "body")
        errors.setdefault(name, []).append("Unknown field.")
    prefix = f"{where}." if where else ""
    parallelism, rate = raw.get("parallelism"), raw.get("ratePerSecond")
    if (problem := _parallelism_error(parallelism)) is not None:
        errors.setdefault(f"{prefix}parallelism", []).append(problem)
        parallelism = None
    if (problem := _rate_error(rate)) is not None:
        errors.setdefault(f"{prefix}ratePerSecond", []).append(problem)
        rate = None
    return Limit(parallelism, float(rate) if rate is not None else None)


def host_key_error(key: Any) -> str | None:
    """Why `key` cannot name a target host (`name`, `name:port`, an IPv4 address or an
    [IPv6] literal, each with an optional port), or None."""
    if not isinstance(key, str) or not key:
        return "A host is a name such as api.example.com, optionally with :port."
    if len(key) > MAX_HOST_KEY:
        return f"A host is at most {MAX_HOST_KEY} characters."
    key = normalized_host_key(key)
    host, port = key, None
    if key.startswith("["):
        end = key.find("]")
        if end < 0:
            return "An IPv6 address is written in brackets: [2001:db8::1] or [2001:db8::1]:8443."
        host, rest = key[1:end], key[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return "After an [IPv6] address only :port may follow."
            port = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "Not a valid IPv6 address."
    else:
        if key.count(":") == 1:
            host, port = key.split(":")
        elif ":" in key:
            return "An IPv6 address is written in brackets: [2001:db8::1]."
        if len(host) > 253 or not _HOST_NAME.match(host):
            return "Not a valid host name (letters, digits, '-', '_' and dots; non-ASCII names in their xn-- form)."
    if port is not None and (not _PORT.match(port) or not 1 <= int(port) <= 65535):
        return "The port must be a number from 1 to 65535."
    return None


def normalized_host_key(key: str) -> str:
    """Host keys compare in lower case, as target hosts are computed (`target_host`)."""
    return key.lower()


def validate_flow_control(data: Any) -> FlowLimits:
    """The wire object `{parallelism, ratePerSecond, hosts}` (each optional: absent or null is
    no limit) as FlowLimits; ValidationFailed naming every bad field, and nothing is kept."""
    errors: dict[str, list[str]] = {}
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["Expected a JSON object {parallelism, ratePerSecond, hosts}."]})
    tenant = _limit(data, "", errors)
    hosts: dict[str, Limit] = {}
    raw_hosts = data.get("hosts")
    if raw_hosts is None:
        raw_hosts = {}
    if not isinstance(raw_hosts, dict):
        errors.setdefault("hosts", []).append('Must be an object {"host": {parallelism, ratePerSecond}}.')
        raw_hosts = {}
    if len(raw_hosts) > MAX_HOSTS:
        errors.setdefault("hosts", []).append(f"At most {MAX_HOSTS} hosts.")
        raw_hosts = {}
    for raw_key, raw_limit in raw_hosts.items():
        where = _host_field(raw_key)
        if (problem := host_key_error(raw_key)) is not None:
            errors.setdefault(where, []).append(problem)
            continue
        key = normalized_host_key(raw_key)
        if key in hosts:
            errors.setdefault(where, []).append(f"{key} is named twice (host names compare in lower case).")
            continue
        limit = _limit(raw_limit, where, errors)
        if isinstance(raw_limit, dict) and not limit.limited and where not in errors:
            errors.setdefault(where, []).append("Give parallelism or ratePerSecond; remove the host for no limit.")
            continue
        hosts[key] = limit
    if errors:
        raise ValidationFailed(errors)
    return FlowLimits(tenant=tenant, hosts=hosts)


def _host_field(key: Any) -> str:
    """The field name of a host's limit, naming the host when it can be shown as it is."""
    shown = str(key)
    if not _PRINTABLE.match(shown) or '"' in shown:
        return "hosts"
    if len(shown) > 60:
        shown = shown[:60] + "…"
    return f'hosts["{shown}"]'


# --- The target host of a call ---------------------------------------------------------------


def target_host(url: str) -> str:
    """The host a call's request goes to, as limits name it: the host the HTTP client contacts
    (lower case, IDNA), with the port when the URL names one other than its scheme's default."""
    parts = urlsplit(url)
    host = client_host(url)
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and port != DEFAULT_PORTS.get(parts.scheme.lower()):
        return f"{host}:{port}"
    return host


# --- Admission: which candidates start now ------------------------------------------------------


def _us(seconds: float) -> int:
    return round(seconds * 1e6)


@dataclass
class Gauge:
    """One limit while a start decides: Running calls counted, and the GCRA's TAT (epoch s)."""

    limit: Limit
    running: int = 0
    tat: float | None = None

    # Times are compared and moved in whole microseconds, as they are stored (started_at), and
    # the interval is rounded up: float error never lets two stored starts come closer than
    # 1/rate.

    def lookahead(self) -> float:
        """How long before its start a call may be admitted under this rate."""
        if self.limit.rate is None:
            return 0.0
        return min(LOOKAHEAD_SECONDS, MAX_AHEAD / self.limit.rate)

    def has_room(self, now: float, *, ahead: bool = False) -> bool:
        """Whether a call may be admitted now, to start now (or, `ahead`, within the lookahead)."""
        if self.limit.parallelism is not None and self.running >= self.limit.parallelism:
            return False
        if self.limit.rate is None or self.tat is None:
            return True
        return _us(now) >= _us(self.tat) - (_us(self.lookahead()) if ahead else 0)

    def start_at(self, now: float) -> float:
        """The earliest start this limit allows: now, or its TAT."""
        if self.limit.rate is None or self.tat is None:
            return _us(now) / 1e6
        return max(_us(self.tat), _us(now)) / 1e6

    def take(self, start: float) -> None:
        self.running += 1
        if self.limit.rate is not None:
            self.tat = (_us(start) + math.ceil(1e6 / self.limit.rate)) / 1e6

    def room(self, now: float) -> int | None:
        """How many could be admitted now, at most (None: no bound)."""
        if not self.has_room(now, ahead=True):
            return 0
        free = None if self.limit.parallelism is None else self.limit.parallelism - self.running
        if self.limit.rate is not None:
            # Starts 1/rate apart from max(TAT, now), up to now + the lookahead.
            first = self.start_at(now)
            fits = min(1 + int((now + self.lookahead() - first) * self.limit.rate), MAX_AHEAD + 1)
            free = fits if free is None else min(free, fits)
        return free

    def next_room_at(self) -> float | None:
        """When the rate next lets a call be admitted (epoch s), if it is the rate that holds."""
        if self.limit.rate is None or self.tat is None:
            return None
        return self.tat - self.lookahead()


@dataclass(frozen=True)
class Candidate:
    key: Any
    due_at: datetime
    order: str  # the call id as text: the tie-break after due_at
    host: str | None

    @property
    def rank(self) -> tuple[datetime, str]:
        return (self.due_at, self.order)


@dataclass(frozen=True)
class Waiting:
    """The oldest held call of one queue that is not among the candidates (or the oldest due
    call that no start has decided yet: orchestration.admission)."""

    queue: str
    due_at: datetime
    order: str

    @property
    def rank(self) -> tuple[datetime, str]:
        return (self.due_at, self.order)


@dataclass
class Plan:
    # (candidate, when it starts: now, or a moment later under a rate)
    admitted: list[tuple[Candidate, float]] = field(default_factory=list)
    # (candidate, the queue it waits in)
    held: list[tuple[Candidate, str]] = field(default_factory=list)


def queue_of(host: str | None, limits: FlowLimits) -> str:
    """The queue a held call waits in: its host's, when that host has a limit of its own, else
    the tenant's. A call never starts before an older held call of its own queue."""
    if host is not None and host in limits.hosts:
        return host
    return TENANT_QUEUE


def competes(other: str, queue: str, *, limits: FlowLimits, hosts: dict[str, Gauge], now: float) -> bool:
    """Whether an older call waiting in queue `other` goes before a newer one of `queue`: one
    of its own queue (the tenant's queue only when the tenant has a limit of its own: without
    one its calls never wait), or, when the tenant has a limit of its own, one of a host with
    room, which the tenant's capacity must serve first."""
    if other == queue:
        return queue != TENANT_QUEUE or limits.tenant.limited
    gauge = hosts.get(other)
    return limits.tenant.limited and (gauge is None or gauge.has_room(now, ahead=True))


def plan_admission(
    candidates: list[Candidate],
    *,
    limits: FlowLimits,
    tenant: Gauge,
    hosts: dict[str, Gauge],
    waiting: list[Waiting],
    now: float,
) -> Plan:
    """Decide, in due order, which of one tenant's candidates start now; the gauges are
    updated as calls are admitted (their TATs are what the caller stores).

    A candidate waits when a limit it falls under has no room, or when an older held call
    competes with it: one of its own queue, or (when the tenant has a limit of its own) one
    of another queue whose host has room, which the tenant's capacity must serve first.
    Calls of a host at its own limit never hold back the tenant's calls to other hosts.
    """
    plan = Plan()
    # The oldest waiting call of each queue: the held calls outside the candidates, then the
    # candidates this plan holds (each older than the ones after it).
    oldest: dict[str, tuple[datetime, str]] = {}
    for item in waiting:
        if item.queue not in oldest or item.rank < oldest[item.queue]:
            oldest[item.queue] = item.rank

    for candidate in sorted(candidates, key=lambda c: c.rank):
        queue = queue_of(candidate.host, limits)
        gauges = [tenant] + ([hosts[queue]] if queue != TENANT_QUEUE else [])
        behind = any(
            rank < candidate.rank and competes(other, queue, limits=limits, hosts=hosts, now=now)
            for other, rank in oldest.items()
        )
        if behind or not all(gauge.has_room(now, ahead=True) for gauge in gauges):
            plan.held.append((candidate, queue))
            if queue not in oldest:
                oldest[queue] = candidate.rank
            continue
        start = max(gauge.start_at(now) for gauge in gauges)
        for gauge in gauges:
            gauge.take(start)
        plan.admitted.append((candidate, start))
    return plan
