"""Cancel racing the timer has exactly one winner (docs/retries.md, 'Cancel racing the timer').

Hundreds of calls fall due within one second while real qcluster workers fire them (one cluster
on SQLite, two on PostgreSQL), and each is cancelled at its due instant from another process:
half through the API of a real gunicorn, half by a process calling the service itself
(tests/controls/cancel_process.py), a few milliseconds either side of the due instant, and a
few 1.5 s early or late so that both outcomes certainly occur. The target records every request
with its X-Service-Call-Id (tests/support/flaky.py). For every call, exactly one of:

- the cancel answered 200, the call is Cancelled (one ServiceCallCancelled, no timer left),
  it has no attempt and the target never heard of it; or
- it ran once (one attempt row, one request received, attempt 1) and the cancel answered 409
  naming Running or Succeeded.

Never both, never neither, nothing left Scheduled or Running. (On a machine too loaded for the
web server to keep up, the API's cancels arrive late and mostly lose; the service's still race.)
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from execution.models import HttpExecution
from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.agent_process import ROOT, agent_env, gunicorn
from tests.support.api import call_url, calls_url
from tests.support.factories import make_call
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster, database_url
from timer.models import TimerSchedule

# serial: cancels are aimed at offsets of a few ms from the due instant, from a measured latency.
pytestmark = [pytest.mark.workers, pytest.mark.serial, pytest.mark.django_db(transaction=True)]

CALLS = 300
# Calls fall due 3 ms apart: 300 within 0.9 s.
SPACING_MS = 3
# Each cancel is sent this far from its call's due instant (cycling through the list). The
# middle ones race the timer; the outer ones are there so that both outcomes certainly occur.
OFFSETS_MS = (-1500, -40, -20, -10, -5, 0, 0, 5, 10, 20, 40, 1500)
SUBMITTERS = 6
# Who sends the cancels, in turn: gunicorn's API, and a process calling the service itself
# (tests/controls/cancel_process.py), which cancels at its instant more precisely.
EDGES = ("api", "service")
SERVICE_CANCELS_TIMEOUT = 90
# The cancel process's threads, each keeping its connection between its cancels: on PostgreSQL
# its pool holds one for each (docs/deploy.md, "Connections"), as a worker process's does.
SERVICE_THREADS = 16
# Calls submitted to measure how fast submitting goes right now (see _probe).
PROBE = 24


@dataclass
class Answer:
    status: int
    body: dict
    took: float  # seconds from sending the cancel to its answer


def _cancel(port: int, key: str, call_id: str, fire_at: float) -> Answer:
    delay = fire_at - time.time()
    if delay > 0:
        time.sleep(delay)
    sent = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", call_url(call_id, suffix="/cancel"), headers={"Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        body = json.loads(raw)
    except ValueError:
        body = {"raw": raw[:300].decode(errors="replace")}
    return Answer(response.status, body, time.monotonic() - sent)


def _warm_up(port: int, key: str) -> None:
    """Load the app in every gunicorn worker before the race (its first request imports it)."""
    for _ in range(8):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", calls_url() + "?limit=1", headers={"Authorization": f"Bearer {key}"})
            assert conn.getresponse().status == 200
        finally:
            conn.close()


def _submit_all(flaky, tenant: str, count: int, first_due: datetime) -> list[tuple[int, str, float]]:
    """Submit `count` calls due SPACING_MS apart from `first_due`, from a few threads (a
    PostgreSQL commit costs some milliseconds); returns (n, call id, due timestamp) of each."""

    def submit(slice_: range) -> list[tuple[int, str, float]]:
        try:
            made = []
            for n in slice_:
                call = make_call(
                    tenant,
                    name=f"race {n}",
                    url=flaky.url(200),
                    due_at=first_due + timedelta(milliseconds=SPACING_MS * n),
                    correlation_id=f"race-{n}",
                )
                made.append((n, str(call.pk), call.due_at.timestamp()))
            return made
        finally:
            connection.close()

    with ThreadPoolExecutor(SUBMITTERS) as pool:
        slices = [range(i, count, SUBMITTERS) for i in range(SUBMITTERS)]
        return sorted(call for made in pool.map(submit, slices) for call in made)


def _probe(flaky, port: int, key: str) -> tuple[float, float]:
    """(lead, latency): how far ahead the first call must fall due for every call to be
    submitted before the first cancel (twice what submitting takes at the rate measured now,
    plus the earliest cancel's lead and a margin), and how long one cancel takes on its own.
    Measured on globex calls due in an hour, outside the race."""
    started = time.monotonic()
    probes = _submit_all(flaky, "globex", PROBE, datetime.now(UTC) + timedelta(hours=1))
    per_call = (time.monotonic() - started) / PROBE
    took = sorted(_cancel(port, key, call_id, 0).took for _, call_id, _ in probes[:8])
    return 2 * per_call * CALLS - min(OFFSETS_MS) / 1000 + 1.0, took[len(took) // 2]


@contextmanager
def cancel_process(env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """tests/controls/cancel_process.py in its own process, once it has set Django up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.controls.cancel_process"],
        cwd=ROOT,
        env={**env, "DB_POOL_SIZE": str(SERVICE_THREADS)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready", "the cancel process did not start"
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _service_cancels(proc: subprocess.Popen, plan: list[tuple[float, int, str]]) -> dict[str, Answer]:
    """Hand the plan to the cancel process; its answers, once every cancel was sent."""
    proc.stdin.write(
        json.dumps({"threads": SERVICE_THREADS, "cancels": [[at, "acme", call_id] for at, _, call_id in plan]})
    )
    proc.stdin.write("\n")
    proc.stdin.flush()
    # Bounded: a process that hangs is killed, which ends the read below.
    deadline = threading.Timer(SERVICE_CANCELS_TIMEOUT, lambda: os.killpg(proc.pid, signal.SIGKILL))
    deadline.start()
    try:
        line = proc.stdout.readline()
    finally:
        deadline.cancel()
    assert line, "the cancel process ended without answering"
    return {
        call_id: Answer(status, {"detail": detail, "status": detail}, took)
        for call_id, status, detail, took in json.loads(line)
    }


def race(world, flaky, tmp_path, *, clusters: int) -> None:
    env = agent_env(tmp_path, DATABASE_URL=database_url(), EGRESS_ALLOWLIST="127.0.0.0/8,::1")
    started = []
    try:
        # The product's default staleness, not the crash tests' 3 s: nothing is killed here, and
        # on a loaded machine a heartbeat can lag 3 s behind the burst's writes, which makes the
        # watchdog interrupt the attempts of a live worker.
        started = [Cluster(tmp_path, name=f"race{i}", WORKER_STALE_SECONDS="10").start() for i in range(clusters)]
        with gunicorn(env, workers=2, threads=8) as port, cancel_process(env) as canceller:
            _warm_up(port, world.acme_key)
            lead, latency = _probe(flaky, port, world.globex_key)
            first_due = datetime.now(UTC) + timedelta(seconds=lead)
            calls = _submit_all(flaky, "acme", CALLS, first_due)
            spare = first_due.timestamp() - time.time()
            assert spare > -min(OFFSETS_MS) / 1000, f"submitting took too long: {spare:.1f}s to spare"

            # Every offset is used by both edges in turn. An API cancel is sent one (unloaded)
            # cancel's latency early, so that it lands about its offset from the due instant.
            by_api, by_service = [], []
            for n, call_id, due in calls:
                at = due + OFFSETS_MS[n % len(OFFSETS_MS)] / 1000
                if EDGES[(n // len(OFFSETS_MS)) % 2] == "api":
                    by_api.append((at - latency, n, call_id))
                else:
                    by_service.append((at, n, call_id))
            with ThreadPoolExecutor(64) as pool:
                service = pool.submit(_service_cancels, canceller, sorted(by_service))
                futures = {
                    call_id: pool.submit(_cancel, port, world.acme_key, call_id, fire_at)
                    for fire_at, n, call_id in sorted(by_api)
                }
                answers = {call_id: future.result(timeout=90) for call_id, future in futures.items()}
                answers.update(service.result(timeout=90))

            wait_for(
                lambda: (
                    not ServiceCall.objects.filter(
                        tenant_id="acme", status__in=[ServiceCall.Status.SCHEDULED, ServiceCall.Status.RUNNING]
                    ).exists()
                ),
                timeout=60,
                interval=0.25,
            )
    finally:
        for cluster in started:
            cluster.stop()
    numbers = {call_id: n for n, call_id, _ in calls}

    received = Counter(arrival.call_id for arrival in flaky.arrivals)
    rows = Counter(str(call_id) for call_id in HttpExecution.objects.values_list("service_call_id", flat=True))
    statuses, errors = {}, {}
    for pk, status, error_kind, meta in ServiceCall.objects.filter(tenant_id="acme").values_list(
        "pk", "status", "error_kind", "outcome_meta"
    ):
        statuses[str(pk)] = status
        errors[str(pk)] = (error_kind, ((meta or {}).get("errorMeta") or {}).get("message"))
    events = defaultdict(list)
    for aggregate_id, event_type in OutboxEvent.objects.order_by("id").values_list("aggregate_id", "event_type"):
        events[str(aggregate_id)].append(event_type)
    timers = set(str(pk) for pk in TimerSchedule.objects.values_list("service_call_id", flat=True))

    assert len(statuses) == CALLS
    assert set(received) <= set(statuses), "the target got a request that names no call"
    problems = []
    interrupted = 0
    outcomes: Counter = Counter()
    for call_id, answer in answers.items():
        n = numbers[call_id]
        offset = OFFSETS_MS[n % len(OFFSETS_MS)]
        edge = EDGES[(n // len(OFFSETS_MS)) % 2]
        status = statuses[call_id]
        seen = (status, answer.status, received[call_id], rows[call_id])
        if answer.status == 200:
            outcomes[("cancelled", edge, offset)] += 1
            if seen != ("Cancelled", 200, 0, 0) or answer.body.get("status") != "Cancelled":
                problems.append(f"call {n} (cancel {offset:+} ms) was cancelled but: {seen}")
            if events[call_id] != ["ServiceCallSubmitted", "ServiceCallScheduled", "ServiceCallCancelled"]:
                problems.append(f"call {n}: events {events[call_id]}")
            if call_id in timers:
                problems.append(f"call {n}: cancelled with its timer left")
        elif answer.status == 409:
            outcomes[("ran", edge, offset)] += 1
            # Succeeded; or sent, then judged by a watchdog that took its live worker for dead
            # (Failed/Interrupted): either way it ran once, which is what this test is about.
            interrupted += errors[call_id][0] == "Interrupted"
            finished = status == "Succeeded" or (status, errors[call_id][0]) == ("Failed", "Interrupted")
            if not finished or seen[1:] != (409, 1, 1) or [a.attempt for a in flaky.of(call_id)] != ["1"]:
                problems.append(f"call {n} (cancel {offset:+} ms) ran but: {seen} {errors[call_id]}")
            if not any(word in answer.body.get("detail", "") for word in ("Running", "Succeeded")):
                problems.append(f"call {n}: the 409 names no status: {answer.body}")
            if "ServiceCallCancelled" in events[call_id]:
                problems.append(f"call {n}: ran and has a ServiceCallCancelled event")
        else:
            problems.append(f"call {n}: the cancel answered {answer.status} {answer.body}")
    for edge in EDGES:
        took = sorted(
            answer.took
            for call_id, answer in answers.items()
            if EDGES[(numbers[call_id] // len(OFFSETS_MS)) % 2] == edge
        )
        print(
            f"{edge} cancels: median {took[len(took) // 2] * 1000:.0f} ms, p90 {took[len(took) * 9 // 10] * 1000:.0f} ms"
        )
        print(
            "  outcomes by offset (ms):",
            {
                (kind, offset): v
                for (kind, e, offset), v in sorted(outcomes.items(), key=lambda kv: (kv[0][2], kv[0][0]))
                if e == edge
            },
        )
    print(f"(one API cancel alone: {latency * 1000:.0f} ms; ran but Interrupted: {interrupted})")
    late = sorted(
        (began - due).total_seconds()
        for began, due in ServiceCall.objects.filter(tenant_id="acme", started_at__isnull=False).values_list(
            "started_at", "due_at"
        )
    )
    if late:
        print(f"start lateness: median {late[len(late) // 2] * 1000:.0f} ms, max {late[-1] * 1000:.0f} ms")
    assert not problems, f"{len(problems)} calls broke the rule:\n" + "\n".join(problems[:30])
    cancelled = sum(v for (kind, _, _), v in outcomes.items() if kind == "cancelled")
    assert 0 < cancelled < CALLS, outcomes  # both outcomes occurred: the race was run
    # Every call ran at most once in all: no request names a call twice.
    assert max(received.values(), default=0) <= 1


def test_cancel_racing_the_timer_has_one_winner_on_sqlite_with_one_cluster(world, flaky, tmp_path):
    race(world, flaky, tmp_path, clusters=1)


@pytest.mark.postgres
def test_cancel_racing_the_timer_has_one_winner_on_postgres_with_two_clusters(world, flaky, tmp_path):
    race(world, flaky, tmp_path, clusters=2)
