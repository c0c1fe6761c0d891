"""Flow control in real `qcluster` workers against real targets that record what reaches them
(docs/flow-control.md): never more than `parallelism` at once, never more than `rate` starts
in any second, nothing dropped, held calls started in due order; a host's limit for that host
only; and a tenant at its limit never delays another tenant's calls. On SQLite with one
cluster, and on PostgreSQL with two clusters sharing the work."""

from __future__ import annotations

import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import pytest

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.factories import make_call, make_flow_control
from tests.support.targets import serving_target
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster

# serial: rates counted in one-second windows and starts within 0.5 s, in real qclusters.
pytestmark = [pytest.mark.workers, pytest.mark.serial, pytest.mark.django_db(transaction=True)]

PARALLELISM = 3
RATE = 10
CALLS = 30
# Arrival times at the target are read on another clock than the start's, after a connect:
# a window this much shorter than a second must still hold at most RATE of them.
ARRIVAL_JITTER = 0.05


@pytest.fixture
def clusters(tmp_path):
    running: list[Cluster] = []

    def start(count: int = 1, **env: str) -> list[Cluster]:
        made = [Cluster(tmp_path, name=f"flow{len(running) + n}", **env) for n in range(count)]
        running.extend(made)
        return [cluster.start() for cluster in made]

    yield start
    for cluster in running:
        cluster.stop()


def _terminal(tenant_id: str, count: int) -> bool:
    return ServiceCall.objects.filter(tenant_id=tenant_id, status__in=ServiceCall.TERMINAL).count() >= count


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals [start, end) open at one instant."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    best = current = 0
    for _, step in points:
        current += step
        best = max(best, current)
    return best


def _most_in_a_window(times: list, window) -> int:
    """The most of `times` in one half-open window [t, t + window)."""
    times = sorted(times)
    best = 0
    first = 0
    for last, moment in enumerate(times):
        while moment - times[first] >= window:
            first += 1
        best = max(best, last - first + 1)
    return best


def run_limited(http_target, start_clusters, *, clusters: int) -> None:
    """CALLS calls of acme due within half a second, each 250 ms long, under parallelism 3 and
    10 starts per second: a backlog forms and drains at the limits."""
    make_flow_control("acme", parallelism=PARALLELISM, rate=RATE)
    start_clusters(clusters)
    due = datetime.now(UTC) + timedelta(seconds=2)
    rows = [
        make_call(
            "acme",
            name=f"limited {n}",
            url=http_target.url(f"/delay/250?m=n{n}"),
            due_at=due + timedelta(milliseconds=20 * n),
        )
        for n in range(CALLS)
    ]
    wait_for(lambda: _terminal("acme", CALLS), timeout=60, interval=0.2)
    calls = list(ServiceCall.objects.filter(tenant_id="acme"))
    # Nothing dropped, nothing sent twice.
    assert {call.status for call in calls} == {ServiceCall.Status.SUCCEEDED}
    received = sorted(r["query"] for r in http_target.requests)
    assert received == sorted(f"m=n{n}" for n in range(CALLS))
    # Parallelism: at the target, and as the database counts Running calls.
    assert max(r["concurrent"] for r in http_target.requests) <= PARALLELISM
    assert _max_overlap([(c.started_at.timestamp(), c.finished_at.timestamp()) for c in calls]) <= PARALLELISM
    # Rate: starts at least 1/rate apart, so no 1-second window holds more than RATE (on the
    # stored times themselves: datetimes, exact to the microsecond).
    assert _most_in_a_window([c.started_at for c in calls], timedelta(seconds=1)) <= RATE
    assert _most_in_a_window([r["at"] for r in http_target.requests], 1.0 - ARRIVAL_JITTER) <= RATE
    # Held calls start in due order.
    by_due = sorted(calls, key=lambda c: (c.due_at, c.pk))
    assert [c.pk for c in by_due] == [c.pk for c in sorted(by_due, key=lambda c: c.started_at)]
    # They were held: a backlog formed and drained no faster than the rate. (How promptly a
    # held call starts once there is room is measured by bench/, not by a timed test.)
    assert sum(1 for c in calls if c.held_ms > 0) >= CALLS // 2
    # On the stored datetimes: admitted starts are exactly 1/rate apart, which floats of
    # seconds since the epoch may round to a hair less.
    started = [c.started_at for c in calls]
    assert max(started) - min(started) >= timedelta(seconds=(CALLS - 1) / RATE)
    wait_for(lambda: not OutboxEvent.objects.filter(tenant_id="acme", published_at__isnull=True).exists())
    held_events = OutboxEvent.objects.filter(
        tenant_id="acme", event_type="ServiceCallRunning", event_payload__payload__heldMs__gt=0
    )
    assert held_events.count() == sum(1 for c in calls if c.held_ms > 0)
    assert len(rows) == CALLS


def test_one_cluster_keeps_the_tenants_parallelism_and_rate(world, http_target, clusters):
    run_limited(http_target, clusters, clusters=1)


@pytest.mark.postgres
def test_two_clusters_on_postgres_keep_the_tenants_parallelism_and_rate_together(world, http_target, clusters):
    run_limited(http_target, clusters, clusters=2)


def test_a_host_limit_applies_to_that_host_only(world, clusters):
    with ExitStack() as stack:
        slow = stack.enter_context(serving_target())
        other = stack.enter_context(serving_target())
        make_flow_control("acme", hosts={f"127.0.0.1:{slow.port}": {"parallelism": 1}})
        clusters()
        due = datetime.now(UTC) + timedelta(seconds=1.5)
        for n in range(8):
            make_call("acme", name=f"slow {n}", url=slow.url("/delay/300"), due_at=due)
            make_call("acme", name=f"other {n}", url=other.url("/delay/300"), due_at=due)
        wait_for(lambda: _terminal("acme", 16), timeout=40, interval=0.2)
        assert max(r["concurrent"] for r in slow.requests) == 1
        assert max(r["concurrent"] for r in other.requests) >= 4
        others = ServiceCall.objects.filter(tenant_id="acme", name__startswith="other")
        assert all(c.held_ms == 0 for c in others)
        assert max((c.started_at - c.due_at).total_seconds() for c in others) < 0.5
        assert ServiceCall.objects.filter(tenant_id="acme", name__startswith="slow", held_ms__gt=0).count() >= 6


def _p99_lateness(tenant_id: str) -> float:
    values = sorted((c.started_at - c.due_at).total_seconds() for c in ServiceCall.objects.filter(tenant_id=tenant_id))
    return values[min(len(values) - 1, int(len(values) * 0.99))]


def test_a_tenant_at_its_limit_does_not_delay_another_tenants_calls(world, http_target, clusters):
    clusters()
    # globex alone: its lateness without any held backlog.
    first = datetime.now(UTC) + timedelta(seconds=1.5)
    for n in range(60):
        make_call(
            "globex", name=f"alone {n}", url=http_target.url("/ok"), due_at=first + timedelta(milliseconds=33 * n)
        )
    wait_for(lambda: _terminal("globex", 60), timeout=30, interval=0.2)
    alone = _p99_lateness("globex")
    ServiceCall.objects.filter(tenant_id="globex").delete()

    # acme at its limit with a backlog of 300 held calls, while globex's calls fall due.
    make_flow_control("acme", parallelism=1)
    time.sleep(1.2)  # the workers' list of limited tenants (re-read every second)
    backlog_due = datetime.now(UTC) + timedelta(seconds=1)
    for n in range(300):
        make_call("acme", name=f"backlog {n}", url=http_target.url("/delay/50"), due_at=backlog_due)
    first = backlog_due + timedelta(seconds=1)
    for n in range(60):
        make_call(
            "globex", name=f"beside {n}", url=http_target.url("/ok"), due_at=first + timedelta(milliseconds=33 * n)
        )
    wait_for(lambda: _terminal("globex", 60), timeout=30, interval=0.2)
    beside = _p99_lateness("globex")
    held = ServiceCall.objects.filter(tenant_id="acme", status=ServiceCall.Status.SCHEDULED, held_since__isnull=False)
    assert held.count() > 100, "acme's backlog was not held while globex's calls ran"
    assert all(c.held_ms == 0 for c in ServiceCall.objects.filter(tenant_id="globex"))
    assert beside < alone + 0.3, (alone, beside)
