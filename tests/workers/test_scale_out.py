"""Scale-out on PostgreSQL: several clusters claim the same calls, timers and events, and
each is processed once (SELECT ... FOR UPDATE SKIP LOCKED and conditional updates)."""

import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from execution.models import HttpExecution
from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.factories import make_call
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster

pytestmark = [pytest.mark.workers, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CALLS = 300
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def redis_reachable() -> bool:
    return (
        subprocess.run([sys.executable, "scripts/reachable.py", "redis", REDIS_URL], capture_output=True).returncode
        == 0
    )


def run_two_clusters(world, http_target, tmp_path, **env):
    now = datetime.now(UTC)
    markers = {}
    for n in range(CALLS):
        call = make_call(
            name=f"fan {n}",
            url=http_target.url(f"/ok?m=n{n}"),
            due_at=now + timedelta(seconds=4, milliseconds=10 * n) if n % 6 else None,
            correlation_id=f"f{n}",
        )
        markers[f"n{n}"] = call.pk
    clusters = [Cluster(tmp_path, name=f"pg{i}", **env).start() for i in range(2)]
    try:
        wait_for(
            lambda: ServiceCall.objects.filter(status=ServiceCall.Status.SUCCEEDED).count() == CALLS,
            timeout=90,
            interval=0.25,
        )
        wait_for(lambda: not OutboxEvent.objects.filter(published_at__isnull=True).exists(), timeout=30)
    finally:
        for cluster in clusters:
            cluster.stop()
    received = Counter(r["query"].removeprefix("m=") for r in http_target.requests)
    assert set(received) == set(markers)
    assert max(received.values()) == 1, [m for m, c in received.items() if c > 1]
    assert OutboxEvent.objects.count() == 4 * CALLS
    # Both clusters did work: the claims were shared, not serialised behind one cluster.
    assert HttpExecution.objects.values("worker_id").distinct().count() >= 2


def test_two_clusters_on_postgres_send_every_call_exactly_once(world, http_target, tmp_path):
    run_two_clusters(world, http_target, tmp_path)


@pytest.mark.redis
def test_two_clusters_with_the_redis_broker_send_every_call_exactly_once(world, http_target, tmp_path):
    if not redis_reachable():
        pytest.skip(f"needs Redis at {REDIS_URL} (set TEST_REDIS_URL)")
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    run_two_clusters(world, http_target, tmp_path, Q_BROKER=REDIS_URL)
