"""What the schedules tests in real workers share."""

from __future__ import annotations

import pytest

from tests.workers.cluster import Cluster


@pytest.fixture
def clusters(tmp_path):
    """start(count): that many real qclusters on the test database, stopped after the test."""
    running: list[Cluster] = []

    def start(count: int) -> None:
        for n in range(count):
            running.append(Cluster(tmp_path, name=f"schedules{n}").start())

    yield start
    for cluster in running:
        cluster.stop()
