"""Flow control's pure rules (orchestration.flow): the limits' validation, the target host of a
URL, the GCRA, and which candidates a start admits, in due order (docs/flow-control.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.errors import ValidationFailed
from orchestration.flow import (
    MAX_AHEAD,
    MAX_HOSTS,
    Candidate,
    FlowLimits,
    Gauge,
    Limit,
    Waiting,
    plan_admission,
    target_host,
    validate_flow_control,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _errors(data) -> dict[str, list[str]]:
    with pytest.raises(ValidationFailed) as caught:
        validate_flow_control(data)
    return caught.value.errors


# --- Validation --------------------------------------------------------------------------------


def test_it_takes_limits_for_the_tenant_and_its_hosts_in_the_wire_shape():
    limits = validate_flow_control(
        {"parallelism": 5, "ratePerSecond": 2.5, "hosts": {"API.example.com": {"parallelism": 1}}}
    )
    assert limits.tenant == Limit(5, 2.5)
    assert limits.hosts == {"api.example.com": Limit(1, None)}
    assert limits.as_wire() == {
        "parallelism": 5,
        "ratePerSecond": 2.5,
        "hosts": {"api.example.com": {"parallelism": 1, "ratePerSecond": None}},
    }


def test_absent_or_null_fields_mean_no_limit():
    assert validate_flow_control({}) == FlowLimits()
    assert validate_flow_control({"parallelism": None, "ratePerSecond": None, "hosts": None}) == FlowLimits()
    assert not FlowLimits().limited


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"parallelism": 0}, "parallelism"),
        ({"parallelism": -1}, "parallelism"),
        ({"parallelism": 1.5}, "parallelism"),
        ({"parallelism": "3"}, "parallelism"),
        ({"parallelism": True}, "parallelism"),
        ({"parallelism": 1001}, "parallelism"),
        ({"ratePerSecond": 0}, "ratePerSecond"),
        ({"ratePerSecond": -2}, "ratePerSecond"),
        ({"ratePerSecond": "fast"}, "ratePerSecond"),
        ({"ratePerSecond": float("inf")}, "ratePerSecond"),
        ({"ratePerSecond": float("nan")}, "ratePerSecond"),
        ({"ratePerSecond": 1e6}, "ratePerSecond"),
        ({"ratePerSecond": 0.0001}, "ratePerSecond"),
        ({"burst": 3}, "burst"),
        ({"hosts": []}, "hosts"),
        ({"hosts": {"api.example.com": 3}}, 'hosts["api.example.com"]'),
        ({"hosts": {"api.example.com": {}}}, 'hosts["api.example.com"]'),
        ({"hosts": {"api.example.com": {"parallelism": 0}}}, 'hosts["api.example.com"].parallelism'),
        ({"hosts": {"api.example.com": {"hosts": {}}}}, 'hosts["api.example.com"].hosts'),
        ({"hosts": {"http://api.example.com": {"parallelism": 1}}}, 'hosts["http://api.example.com"]'),
        ({"hosts": {"api.example.com/x": {"parallelism": 1}}}, 'hosts["api.example.com/x"]'),
        ({"hosts": {"api example": {"parallelism": 1}}}, 'hosts["api example"]'),
        ({"hosts": {"api.example.com:0": {"parallelism": 1}}}, 'hosts["api.example.com:0"]'),
        ({"hosts": {"api.example.com:99999": {"parallelism": 1}}}, 'hosts["api.example.com:99999"]'),
        ({"hosts": {"::1": {"parallelism": 1}}}, 'hosts["::1"]'),
        ({"hosts": {"[::g]": {"parallelism": 1}}}, 'hosts["[::g]"]'),
        ({"hosts": {"bücher.de": {"parallelism": 1}}}, "hosts"),
        ({"hosts": {"a\ud800": {"parallelism": 1}}}, "hosts"),
        ({"x\x00": 1}, "body"),
        ({"hosts": {"": {"parallelism": 1}}}, "hosts"),
        ({"hosts": {"A.com": {"parallelism": 1}, "a.com": {"parallelism": 2}}}, 'hosts["a.com"]'),
    ],
)
def test_it_refuses_bad_limits_naming_the_field(data, field):
    assert field in _errors(data)


def test_it_refuses_more_hosts_than_the_maximum():
    hosts = {f"h{n}.example.com": {"parallelism": 1} for n in range(MAX_HOSTS + 1)}
    assert "hosts" in _errors({"hosts": hosts})


def test_it_refuses_anything_but_an_object():
    assert _errors([1, 2]) == {"body": ["Expected a JSON object {parallelism, ratePerSecond, hosts}."]}


@pytest.mark.parametrize(
    "key", ["api.example.com", "api.example.com:8443", "10.0.0.1", "10.0.0.1:80", "[2001:db8::1]", "[::1]:8080"]
)
def test_it_takes_host_names_addresses_and_ports(key):
    assert list(validate_flow_control({"hosts": {key: {"ratePerSecond": 1}}}).hosts) == [key]


# --- The target host ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://API.Example.com/x", "api.example.com"),
        ("https://api.example.com:443/x", "api.example.com"),
        ("http://api.example.com:80/x", "api.example.com"),
        ("http://api.example.com:443/x", "api.example.com:443"),
        ("http://127.0.0.1:8123/ok", "127.0.0.1:8123"),
        ("http://[::1]:8080/", "[::1]:8080"),
        ("http://%61pi.example.com/", "api.example.com"),
    ],
)
def test_the_target_host_is_the_host_contacted_with_a_port_other_than_the_default(url, host):
    assert target_host(url) == host


# --- GCRA --------------------------------------------------------------------------------------


def test_the_rate_spaces_starts_by_one_over_the_rate_with_no_burst():
    gauge = Gauge(Limit(rate=4))
    starts, now = [], 100.0
    while now < 103.0:
        if gauge.has_room(now):
            gauge.take(now)
            starts.append(now)
        now = round(now + 0.01, 2)
    assert all(b - a >= 0.25 - 1e-9 for a, b in zip(starts, starts[1:], strict=False))
    # No 1-second window holds more than 4 starts.
    assert all(sum(1 for s in starts if t <= s < t + 1) <= 4 for t in starts)
    assert len(starts) == 12


def test_an_idle_gap_gives_no_credit():
    gauge = Gauge(Limit(rate=2))
    gauge.take(10.0)
    assert gauge.has_room(50.0)
    gauge.take(50.0)
    assert not gauge.has_room(50.4)  # the TAT restarts from the late start, not from 10.5


def test_parallelism_counts_running_calls():
    gauge = Gauge(Limit(parallelism=2), running=1)
    assert gauge.room(0) == 1
    gauge.take(0)
    assert gauge.room(0) == 0


# --- Admission ---------------------------------------------------------------------------------


def _candidates(*specs) -> list[Candidate]:
    """(name, due offset in ms, host) each."""
    return [
        Candidate(key=name, due_at=T0 + timedelta(milliseconds=ms), order=name, host=host) for name, ms, host in specs
    ]


def _plan(candidates, limits, *, running=None, waiting=(), tats=None):
    running = running or {}
    tats = tats or {}
    tenant = Gauge(limits.tenant, running=sum(running.values()), tat=tats.get(""))
    hosts = {h: Gauge(lim, running=running.get(h, 0), tat=tats.get(h)) for h, lim in limits.hosts.items()}
    return plan_admission(
        candidates, limits=limits, tenant=tenant, hosts=hosts, waiting=list(waiting), now=T0.timestamp()
    )


def test_it_admits_up_to_the_parallelism_in_due_order():
    limits = FlowLimits(tenant=Limit(parallelism=3))
    plan = _plan(_candidates(("c", 3, "a"), ("a", 1, "a"), ("d", 4, "a"), ("b", 2, "a")), limits, running={"a": 1})
    assert [c.key for c, _ in plan.admitted] == ["a", "b"]
    assert [(c.key, queue) for c, queue in plan.held] == [("c", ""), ("d", "")]


def test_an_older_held_call_of_the_queue_goes_first():
    limits = FlowLimits(tenant=Limit(parallelism=10))
    waiting = [Waiting(queue="", due_at=T0, order="old")]
    plan = _plan(_candidates(("new", 5, "a")), limits, waiting=waiting)
    assert plan.admitted == [] and plan.held[0][0].key == "new"
    # ... but not a newer one.
    waiting = [Waiting(queue="", due_at=T0 + timedelta(seconds=1), order="later")]
    assert [c.key for c, _ in _plan(_candidates(("new", 5, "a")), limits, waiting=waiting).admitted] == ["new"]


def test_a_host_at_its_limit_holds_back_only_its_own_calls():
    limits = FlowLimits(tenant=Limit(parallelism=10), hosts={"slow": Limit(parallelism=1)})
    # An older call of "slow" waits for its host; calls to "fast" go ahead of it.
    waiting = [Waiting(queue="slow", due_at=T0, order="s0")]
    plan = _plan(
        _candidates(("s1", 1, "slow"), ("f1", 2, "fast"), ("f2", 3, "fast")),
        limits,
        running={"slow": 1},
        waiting=waiting,
    )
    assert [c.key for c, _ in plan.admitted] == ["f1", "f2"]
    assert [(c.key, queue) for c, queue in plan.held] == [("s1", "slow")]


def test_an_older_call_of_a_host_with_room_goes_first_under_the_tenant_limit():
    limits = FlowLimits(tenant=Limit(parallelism=1), hosts={"slow": Limit(parallelism=2)})
    waiting = [Waiting(queue="slow", due_at=T0, order="s0")]
    plan = _plan(_candidates(("f1", 5, "fast")), limits, waiting=waiting)
    assert plan.admitted == []


def test_the_rate_admits_what_starts_within_the_lookahead_each_at_its_own_start():
    limits = FlowLimits(tenant=Limit(rate=20))
    tenant = Gauge(limits.tenant)
    now = T0.timestamp()
    plan = plan_admission(
        _candidates(*[(f"c{n}", n, "x") for n in range(6)]),
        limits=limits,
        tenant=tenant,
        hosts={},
        waiting=[],
        now=now,
    )
    # One start every 50 ms, from now to now + LOOKAHEAD_SECONDS (100 ms).
    assert [(c.key, round(start - now, 3)) for c, start in plan.admitted] == [("c0", 0), ("c1", 0.05), ("c2", 0.1)]
    assert [c.key for c, _ in plan.held] == ["c3", "c4", "c5"]
    assert tenant.tat == pytest.approx(now + 0.15)


def test_few_calls_are_admitted_ahead_of_their_start():
    limits = FlowLimits(tenant=Limit(rate=1000))
    plan = _plan(_candidates(*[(f"c{n}", n, "x") for n in range(30)]), limits)
    assert len(plan.admitted) == 1 + MAX_AHEAD


def test_a_call_under_two_rates_starts_when_both_allow():
    limits = FlowLimits(tenant=Limit(rate=100), hosts={"x": Limit(rate=20)})
    now = T0.timestamp()
    plan = _plan(_candidates(("a", 1, "x")), limits, tats={"": now + 0.02, "x": now + 0.06})
    [(_, start)] = plan.admitted
    assert start == pytest.approx(now + 0.06)


def test_a_host_rate_applies_to_that_host_only():
    limits = FlowLimits(hosts={"x": Limit(rate=1)})
    plan = _plan(_candidates(("x1", 1, "x"), ("x2", 2, "x"), ("y1", 3, "y"), ("y2", 4, "y")), limits)
    assert [c.key for c, _ in plan.admitted] == ["x1", "y1", "y2"]
    assert [(c.key, queue) for c, queue in plan.held] == [("x2", "x")]


def test_without_a_tenant_limit_calls_left_held_start_in_any_queue():
    # Limits removed while calls waited: nothing holds them any more.
    plan = _plan(_candidates(("b", 5, "x")), FlowLimits(), waiting=[Waiting(queue="", due_at=T0, order="a")])
    assert [c.key for c, _ in plan.admitted] == ["b"]
