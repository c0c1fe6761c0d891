"""Retries survive kill -9 (docs/retries.md, 'At most once per attempt'): the workers are
SIGKILLed three times during a burst of calls with retry policies, against slow and flaky
targets, so attempts are on the wire at each kill. After a final restart:

- every call is terminal, none lost;
- no (call, attempt) pair reached the target twice, and every request the target got has its
  attempt row (the row is committed before the request leaves);
- the attempt log of each call is 1..n with no gap;
- an Interrupted attempt is followed by another attempt only where the policy sets
  retryInterrupted (and attempts are left); elsewhere the call ends Failed/Interrupted.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from execution.models import HttpExecution
from orchestration.models import ServiceCall
from tests.support.factories import make_call
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]

CALLS = 120
MAX_ATTEMPTS = 3


def _script(n: int) -> list[str]:
    """Slow answers (150-450 ms) so that attempts are in flight at each kill; a third of the
    calls fail once with a 503 first, so ordinary retries run through the kills too."""
    slow = f"sleep{150 + (n % 4) * 100}"
    return ["503", slow] if n % 3 == 1 else [slow]


def submit_burst(flaky) -> dict[str, bool]:
    """CALLS calls over ~6 s; returns {call id: retryInterrupted}."""
    now = datetime.now(UTC)
    calls = {}
    for n in range(CALLS):
        retry_interrupted = n % 2 == 0
        call = make_call(
            "acme" if n % 4 < 2 else "globex",
            name=f"burst {n}",
            method="PUT",
            url=flaky.url(*_script(n)),
            body={"n": n},
            due_at=now + timedelta(milliseconds=50 * n) if n % 5 else None,
            retry_policy={
                "maxAttempts": MAX_ATTEMPTS,
                "minBackoffMs": 200,
                "maxBackoffMs": 1000,
                "retryInterrupted": retry_interrupted,
            },
            correlation_id=f"burst-{n}",
        )
        calls[str(call.pk)] = retry_interrupted
    return calls


def test_sigkill_three_times_with_retries_loses_nothing_and_sends_no_attempt_twice(world, flaky, tmp_path):
    policies = submit_burst(flaky)
    clusters = []
    started = time.monotonic()
    try:
        for round_ in range(3):
            cluster = Cluster(tmp_path, name=f"round{round_}").start()
            clusters.append(cluster)
            wait_for(lambda: HttpExecution.objects.filter(state=HttpExecution.State.SENDING).exists(), timeout=20)
            time.sleep(0.3 + 0.4 * round_)
            cluster.kill()
        final = Cluster(tmp_path, name="final").start()
        clusters.append(final)
        wait_for(
            lambda: not ServiceCall.objects.exclude(status__in=ServiceCall.TERMINAL).exists(),
            timeout=90,
            interval=0.25,
        )
    finally:
        for cluster in clusters:
            cluster.stop() if cluster.proc else None
    print(f"all terminal {time.monotonic() - started:.1f}s after the first start")

    calls = {str(c.pk): c for c in ServiceCall.objects.all()}
    attempts: dict[str, list[HttpExecution]] = defaultdict(list)
    for row in HttpExecution.objects.order_by("attempt"):
        attempts[str(row.service_call_id)].append(row)
    pairs = flaky.pairs()
    assert len(calls) == CALLS and set(calls) == set(policies)  # nothing lost

    twice = [pair for pair, count in pairs.items() if count > 1]
    assert not twice, f"(call, attempt) pairs the target received twice: {twice}"
    logged = {(call_id, str(row.attempt)) for call_id, rows in attempts.items() for row in rows}
    assert set(pairs) <= logged, f"requests without an attempt row: {set(pairs) - logged}"

    problems = []
    seen: Counter = Counter()
    for call_id, call in calls.items():
        rows = attempts[call_id]
        retry_interrupted = policies[call_id]
        numbers = [row.attempt for row in rows]
        if not call.is_terminal:
            problems.append(f"{call.name} ended {call.status}")
        if numbers != list(range(1, call.attempts + 1)) or not numbers:
            problems.append(f"{call.name}: attempts {numbers}, counter {call.attempts}")
            continue
        interrupted = [row.attempt for row in rows if row.state == HttpExecution.State.INTERRUPTED]
        for number in interrupted:
            seen["interrupted", retry_interrupted] += 1
            if (call_id, str(number)) not in pairs:
                seen["interrupted before reaching the target"] += 1
            is_last = number == numbers[-1]
            if retry_interrupted and number < MAX_ATTEMPTS:
                if is_last:
                    problems.append(f"{call.name}: attempt {number} Interrupted and not tried again")
                else:
                    seen["retried after Interrupted"] += 1
            elif not is_last:
                problems.append(f"{call.name}: Interrupted attempt {number} was followed by another")
            elif (call.status, call.error_kind) != (ServiceCall.Status.FAILED, "Interrupted"):
                problems.append(f"{call.name}: last attempt Interrupted but the call is {call.status}")
        if call.error_kind == "Interrupted" and rows[-1].state != HttpExecution.State.INTERRUPTED:
            problems.append(f"{call.name}: Failed/Interrupted but its last attempt is {rows[-1].state}")
        if call.status == ServiceCall.Status.SUCCEEDED:
            last = rows[-1]
            if (last.state, last.response_status) != (HttpExecution.State.FINISHED, 200):
                problems.append(f"{call.name}: Succeeded but its last attempt is {last.state} {last.response_status}")
            if pairs[(call_id, str(last.attempt))] != 1:
                problems.append(
                    f"{call.name}: Succeeded but the target got its last attempt {pairs[(call_id, str(last.attempt))]} times"
                )
        seen[call.status, call.error_kind] += 1
    print("outcomes:", dict(seen))
    assert not problems, "\n".join(problems[:30])
    # The kills landed mid-flight in both kinds of policy, and the rule was exercised both ways.
    assert seen["interrupted", True] >= 1 and seen["interrupted", False] >= 1, seen
    assert seen["retried after Interrupted"] >= 1, seen
    assert seen[ServiceCall.Status.FAILED, "Interrupted"] >= 1, seen
