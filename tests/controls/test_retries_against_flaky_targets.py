"""Retries end to end (docs/retries.md): a real qcluster sends calls with retry policies to flaky
targets on 127.0.0.1 (tests/support/flaky.py) and to a closed port.

For each call: how many attempts went out, each logged with its number and carrying it in
X-Service-Call-Attempt, none received twice; the delay before each retry within the policy's
bounds (exactly, from the ServiceCallRetryScheduled event; as a lower bound, at the target);
the final state; and the events in order. Upper bounds on real delays are loose (seconds):
they only tell "the next attempt did come" from "it came after Retry-After's 30 s".
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.core.management import call_command

from execution.models import HttpExecution
from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.factories import make_call, make_tenant
from tests.support.flaky import FlakyTarget, backoff_bounds_ms
from tests.support.listeners import free_port
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster
from timer.models import TimerSchedule

# serial: the gaps between a call's arrivals are held to its backoff's bounds, to the 5 ms.
# No django_db mark: the module's tests share one cluster and one transactional database (the
# `transactional_db` and `cluster` fixtures below), not flushed between tests.
pytestmark = [pytest.mark.workers, pytest.mark.serial]

SUBMITTED, SCHEDULED, RUNNING, RETRY, SUCCEEDED, FAILED = (
    OutboxEvent.Type.SUBMITTED,
    OutboxEvent.Type.SCHEDULED,
    OutboxEvent.Type.RUNNING,
    OutboxEvent.Type.RETRY_SCHEDULED,
    OutboxEvent.Type.SUCCEEDED,
    OutboxEvent.Type.FAILED,
)
# How late a retry may start after its due time, or a request arrive after the previous one's
# delay, before the test calls it lost: generous, since other tests may load the machine.
SLACK_SECONDS = 3.0


@pytest.fixture(scope="module")
def transactional_db(django_db_setup, django_db_blocker) -> Iterator[None]:
    """pytest-django's transactional_db, for the whole module (its name is what has pytest-django
    set the test database up): the tests' writes are committed, for the cluster to read them, and
    the tables are flushed once after the module's last test, as transactional_db does after each
    (which would take the running cluster's worker sessions and task queue along)."""
    with django_db_blocker.unblock():
        try:
            yield
        finally:
            call_command("flush", verbosity=0, interactive=False, reset_sequences=False)


@pytest.fixture(scope="module")
def cluster(transactional_db, tmp_path_factory) -> Iterator[Cluster]:
    """One qcluster for the module's tests: started and stopped once, not for each test (3 s
    each). The tests never see each other's rows: each has a tenant of its own (`tenant`) and
    reads back only its own calls."""
    # The product's default staleness: a heartbeat lagging on a loaded machine must not turn
    # an attempt in flight into Interrupted here (the crash tests use 3 s to recover fast).
    running = Cluster(tmp_path_factory.mktemp("retries"), name="retries", WORKER_STALE_SECONDS="10").start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def tenant(cluster) -> str:
    """A tenant of this test's own, on the module's running cluster."""
    return make_tenant(f"retries-{next(_TENANTS)}").pk


_TENANTS = itertools.count(1)


def _policy(**fields) -> dict:
    """A complete policy in the wire shape, as the call stores it."""
    policy = {
        "maxAttempts": 3,
        "minBackoffMs": 300,
        "maxBackoffMs": 5000,
        "retryOn": ["HttpError5xx", "Http429", "Timeout", "NetworkError"],
        "retryInterrupted": False,
    }
    policy.update(fields)
    return policy


def _wait_terminal(*calls: ServiceCall, timeout: float = 30) -> dict:
    ids = [call.pk for call in calls]
    wait_for(
        lambda: ServiceCall.objects.filter(pk__in=ids, status__in=ServiceCall.TERMINAL).count() == len(ids),
        timeout=timeout,
        interval=0.1,
    )
    return {call.pk: call for call in ServiceCall.objects.filter(pk__in=ids)}


def _events(call_id) -> list[OutboxEvent]:
    return list(OutboxEvent.objects.filter(aggregate_id=call_id).order_by("id"))


def _rows(call_id) -> list[HttpExecution]:
    return list(HttpExecution.objects.filter(service_call_id=call_id).order_by("attempt"))


def _ms(value: datetime) -> datetime:
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _assert_no_timer_left(call: ServiceCall) -> None:
    """The fired timer is marked Reached (in batches, a moment after the start): none is left
    pending for a finished call."""
    wait_for(
        lambda: not TimerSchedule.objects.filter(service_call_id=call.pk, state=TimerSchedule.State.SCHEDULED).exists(),
        timeout=5,
    )


def _assert_attempts(call: ServiceCall, attempts: int, flaky: FlakyTarget | None = None) -> list[HttpExecution]:
    """`attempts` attempts, numbered 1..n in the log, each carrying its number and the call's
    id; at the target (when there is one), each number arrived once, in order."""
    rows = _rows(call.pk)
    assert [row.attempt for row in rows] == list(range(1, attempts + 1))
    assert call.attempts == attempts
    for row in rows:
        assert row.request_headers["X-Service-Call-Attempt"] == str(row.attempt)
        assert row.request_headers["X-Service-Call-Id"] == str(call.pk)
        assert row.state == HttpExecution.State.FINISHED
    if flaky is not None:
        assert [a.attempt for a in flaky.of(call.pk)] == [str(n) for n in range(1, attempts + 1)]
    return rows


def _assert_events(call: ServiceCall, failures: list[dict], final: str) -> list[OutboxEvent]:
    """Submitted, Scheduled, then per attempt Running (n) and RetryScheduled (n) with the
    failure it follows, and the final event with the last attempt's number."""
    events = _events(call.pk)
    expected = [SUBMITTED, SCHEDULED]
    for _ in failures:
        expected += [RUNNING, RETRY]
    expected += [RUNNING, final]
    assert [e.event_type for e in events] == expected
    running = [e.event_payload["payload"]["attempt"] for e in events if e.event_type == RUNNING]
    assert running == list(range(1, len(failures) + 2))
    retries = [e for e in events if e.event_type == RETRY]
    for n, (event, failure) in enumerate(zip(retries, failures, strict=True), start=1):
        payload = event.event_payload["payload"]
        assert payload["attempt"] == n
        assert {key: payload["lastError"].get(key) for key in failure} == failure
    assert events[-1].event_payload["payload"]["attempt"] == len(failures) + 1
    return retries


def _assert_delays(
    call: ServiceCall, retries: list[OutboxEvent], bounds: list[tuple[float, float]], flaky: FlakyTarget | None
) -> None:
    """Each retry was due after a delay within `bounds` (ms) of the failure's recording, it
    started no earlier than that, and (at the target) arrived no sooner after the attempt
    before it."""
    rows = _rows(call.pk)
    arrivals = flaky.of(call.pk) if flaky is not None else []
    for n, (event, (low, high)) in enumerate(zip(retries, bounds, strict=True), start=1):
        next_at = datetime.fromisoformat(event.event_payload["payload"]["nextAttemptAt"])
        delay_ms = (next_at - _ms(event.created_at)).total_seconds() * 1000
        assert low - 1 <= delay_ms <= high + 1, f"retry {n}: {delay_ms} ms not in [{low}, {high}]"
        started = rows[n].started_at  # attempt n + 1
        assert started >= next_at, f"attempt {n + 1} started {started} before its due time {next_at}"
        assert started - next_at < timedelta(seconds=SLACK_SECONDS)
        if arrivals:
            gap = arrivals[n].at - arrivals[n - 1].at
            assert gap >= (low - 5) / 1000, f"attempt {n + 1} arrived {gap:.3f}s after attempt {n}"
            assert gap < high / 1000 + SLACK_SECONDS


def test_5xx_answers_are_retried_with_doubling_backoff_until_a_200(tenant, flaky):
    policy = _policy(maxAttempts=5, minBackoffMs=300, maxBackoffMs=5000)
    call = make_call(tenant, name="5xx then ok", url=flaky.url(503, 502, 200), retry_policy=policy)

    call = _wait_terminal(call)[call.pk]

    assert (call.status, call.error_kind) == (ServiceCall.Status.SUCCEEDED, None)
    assert call.outcome_meta["responseMeta"]["status"] == 200
    rows = _assert_attempts(call, 3, flaky)
    assert [row.response_status for row in rows] == [503, 502, 200]
    retries = _assert_events(
        call, [{"kind": "HttpError", "status": 503}, {"kind": "HttpError", "status": 502}], SUCCEEDED
    )
    # 300 ms then 600 ms, each ±10 %.
    _assert_delays(call, retries, [backoff_bounds_ms(policy, 1), backoff_bounds_ms(policy, 2)], flaky)
    _assert_no_timer_left(call)


def test_a_call_that_keeps_failing_stops_after_max_attempts_with_the_backoff_capped(tenant, flaky):
    # 200 ms, then 400 ms capped to maxBackoffMs 250 ms.
    policy = _policy(maxAttempts=3, minBackoffMs=200, maxBackoffMs=250)
    call = make_call(tenant, name="always 500", url=flaky.url(500), retry_policy=policy)

    call = _wait_terminal(call)[call.pk]

    assert (call.status, call.error_kind) == (ServiceCall.Status.FAILED, "HttpError")
    assert call.outcome_meta["errorMeta"]["status"] == 500
    _assert_attempts(call, 3, flaky)
    retries = _assert_events(call, [{"kind": "HttpError", "status": 500}] * 2, FAILED)
    # The cap applies before the jitter: never above maxBackoffMs, at most 10 % below it.
    assert backoff_bounds_ms(policy, 2) == (225, 250)
    _assert_delays(call, retries, [backoff_bounds_ms(policy, 1), backoff_bounds_ms(policy, 2)], flaky)


def test_retry_after_on_a_429_is_honoured_and_clamped_to_max_backoff(tenant, flaky):
    honoured = make_call(
        tenant,
        name="429, retry after 1 s",
        url=flaky.url("429-ra1", 200),
        retry_policy=_policy(maxAttempts=2, minBackoffMs=100, maxBackoffMs=5000),
    )
    clamped = make_call(
        tenant,
        name="429, retry after 30 s",
        url=flaky.url("429-ra30", 200),
        retry_policy=_policy(maxAttempts=2, minBackoffMs=100, maxBackoffMs=700),
    )

    calls = _wait_terminal(honoured, clamped)

    for call, delay in ((calls[honoured.pk], 1000), (calls[clamped.pk], 700)):
        assert call.status == ServiceCall.Status.SUCCEEDED, call.name
        _assert_attempts(call, 2, flaky)
        retries = _assert_events(call, [{"kind": "HttpError", "status": 429}], SUCCEEDED)
        # Retry-After replaces the computed delay (100 ms here): no jitter, within [min, max].
        _assert_delays(call, retries, [(delay, delay)], flaky)


def test_timeouts_are_retried_and_each_attempt_times_out_on_its_own(tenant, flaky):
    policy = _policy(maxAttempts=3, minBackoffMs=200, maxBackoffMs=1000)
    call = make_call(
        tenant,
        name="slow twice",
        url=flaky.url("sleep2000", "sleep2000", 200),
        timeout_ms=300,
        retry_policy=policy,
    )

    call = _wait_terminal(call)[call.pk]

    assert call.status == ServiceCall.Status.SUCCEEDED
    rows = _assert_attempts(call, 3, flaky)
    assert [row.error_kind for row in rows] == ["Timeout", "Timeout", None]
    retries = _assert_events(call, [{"kind": "Timeout"}] * 2, SUCCEEDED)
    _assert_delays(call, retries, [backoff_bounds_ms(policy, 1), backoff_bounds_ms(policy, 2)], flaky)
    # Each attempt waited for its own timeout before the backoff began.
    arrivals = flaky.of(call.pk)
    for n in (1, 2):
        assert arrivals[n].at - arrivals[n - 1].at >= 0.3 + (backoff_bounds_ms(policy, n)[0] - 5) / 1000


def test_refused_connections_are_retried_as_network_errors(tenant):
    policy = _policy(maxAttempts=3, minBackoffMs=200, maxBackoffMs=1000, retryOn=["NetworkError"])
    call = make_call(tenant, name="closed port", url=f"http://127.0.0.1:{free_port()}/", retry_policy=policy)

    call = _wait_terminal(call)[call.pk]

    assert (call.status, call.error_kind) == (ServiceCall.Status.FAILED, "NetworkError")
    rows = _assert_attempts(call, 3)
    assert {row.error_kind for row in rows} == {"NetworkError"}
    retries = _assert_events(call, [{"kind": "NetworkError"}] * 2, FAILED)
    _assert_delays(call, retries, [backoff_bounds_ms(policy, 1), backoff_bounds_ms(policy, 2)], None)


def test_a_4xx_other_than_429_is_never_retried(tenant, flaky):
    policy = _policy(maxAttempts=5, minBackoffMs=100, maxBackoffMs=200)
    calls = [
        make_call(tenant, name=f"answers {status}", url=flaky.url(status, 200), retry_policy=policy)
        for status in (400, 401, 404, 409, 422)
    ]

    finished = _wait_terminal(*calls)

    for call in finished.values():
        status = int(call.name.split()[-1])
        assert (call.status, call.error_kind) == (ServiceCall.Status.FAILED, "HttpError"), call.name
        assert call.outcome_meta["errorMeta"]["status"] == status
        _assert_attempts(call, 1, flaky)
        _assert_events(call, [], FAILED)
        _assert_no_timer_left(call)
    # More than twice the longest backoff later, still one request each.
    time.sleep(0.5)
    assert all(len(flaky.of(call.pk)) == 1 for call in calls)


def test_failures_outside_retry_on_are_final(tenant, flaky):
    no_429 = make_call(
        tenant,
        name="429 not retried",
        url=flaky.url("429-ra1", 200),
        retry_policy=_policy(minBackoffMs=100, retryOn=["HttpError5xx"]),
    )
    no_timeout = make_call(
        tenant,
        name="timeout not retried",
        url=flaky.url("sleep2000", 200),
        timeout_ms=200,
        retry_policy=_policy(minBackoffMs=100, retryOn=["NetworkError"]),
    )
    no_network = make_call(
        tenant,
        name="refused not retried",
        url=f"http://127.0.0.1:{free_port()}/",
        retry_policy=_policy(minBackoffMs=100, retryOn=["Timeout", "HttpError5xx", "Http429"]),
    )

    finished = _wait_terminal(no_429, no_timeout, no_network)

    for call, kind in ((no_429, "HttpError"), (no_timeout, "Timeout"), (no_network, "NetworkError")):
        call = finished[call.pk]
        assert (call.status, call.error_kind) == (ServiceCall.Status.FAILED, kind), call.name
        _assert_attempts(call, 1, flaky if kind != "NetworkError" else None)
        _assert_events(call, [], FAILED)
