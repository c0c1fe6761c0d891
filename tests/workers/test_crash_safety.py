"""Never lose, never send twice (docs/architecture.md, "Never lose, never send twice"): SIGKILL
the workers mid-flight."""

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from execution.models import HttpExecution
from orchestration.models import ServiceCall
from tests.support.factories import make_call
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]

CALLS = 120


def submit_burst(http_target) -> dict[str, str]:
    """120 calls over ~6 s, each answered after 150-450 ms; returns {marker: call id}."""
    now = datetime.now(UTC)
    ids = {}
    for n in range(CALLS):
        marker = f"n{n}"
        call = make_call(
            "acme" if n % 2 else "globex",
            name=f"burst {n}",
            method="POST",
            url=http_target.url(f"/delay/{150 + (n % 4) * 100}?m={marker}"),
            body={"n": n},
            # every fifth call is due at once, the others spread over the next 6 s
            due_at=now + timedelta(milliseconds=50 * n) if n % 5 else None,
            correlation_id=f"burst-{n}",
        )
        ids[marker] = call.pk
    return ids


def test_sigkill_of_the_workers_three_times_loses_nothing_and_sends_nothing_twice(world, http_target, tmp_path):
    ids = submit_burst(http_target)
    clusters = []
    try:
        for round_ in range(3):
            cluster = Cluster(tmp_path, name=f"round{round_}").start()
            clusters.append(cluster)
            # Kill while requests are on the wire, so the kill lands mid-flight.
            wait_for(lambda: HttpExecution.objects.filter(state=HttpExecution.State.SENDING).exists(), timeout=20)
            time.sleep(0.3 + 0.4 * round_)
            cluster.kill()
        final = Cluster(tmp_path, name="final").start()
        clusters.append(final)
        wait_for(
            lambda: (
                not ServiceCall.objects.filter(
                    status__in=[ServiceCall.Status.SCHEDULED, ServiceCall.Status.RUNNING]
                ).exists()
            ),
            timeout=90,
            interval=0.25,
        )
    finally:
        for cluster in clusters:
            cluster.stop() if cluster.proc else None

    received = Counter(r["query"].removeprefix("m=") for r in http_target.requests)
    calls = {c.pk: c for c in ServiceCall.objects.all()}
    attempts = {a.service_call_id: a for a in HttpExecution.objects.all()}
    assert len(calls) == CALLS  # nothing lost
    by_status = Counter((c.status, c.error_kind) for c in calls.values())
    for marker, call_id in ids.items():
        call = calls[call_id]
        assert call.is_terminal, f"{marker} ended {call.status}"
        assert received[marker] <= 1, f"{marker} was sent {received[marker]} times"
        if call.error_kind == "Interrupted":
            # Only a call whose request may have gone out is Interrupted: its attempt row was
            # written before sending, and the worker died before recording the answer.
            assert attempts[call_id].state == HttpExecution.State.INTERRUPTED
        else:
            assert call.status == ServiceCall.Status.SUCCEEDED, f"{marker}: {call.status} {call.error_kind}"
            assert received[marker] == 1
    print("outcomes:", dict(by_status))
    # The kills landed mid-flight: something was interrupted, and the rest succeeded.
    assert by_status[("Failed", "Interrupted")] >= 1, by_status
    assert by_status[("Succeeded", None)] >= CALLS - 3 * 48, by_status
