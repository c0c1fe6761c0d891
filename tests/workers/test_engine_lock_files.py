"""The engine's cluster lock files (workers/signals.py) do not pile up in DATA_DIR across starts."""

import fcntl
import time

import pytest

from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster
from workers.models import WorkerSession

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]


def lock_files(data_dir):
    return sorted(path.name for path in data_dir.glob("engine-*.lock"))


def engine_lock_held(data_dir) -> bool:
    """Whether some live process holds one of the lock files (a cluster's engine)."""
    # Probe only once the file has been there a moment: a probe between a worker's open and
    # flock would take the lock from it.
    wait_for(lambda: lock_files(data_dir), timeout=10)
    time.sleep(0.3)
    for path in data_dir.glob("engine-*.lock"):
        with open(path, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
    return False


def test_two_clean_starts_and_stops_leave_no_lock_file(world, tmp_path):
    for _ in range(2):
        c = Cluster(tmp_path).start()
        try:
            assert engine_lock_held(tmp_path)
            assert len(lock_files(tmp_path)) == 1
        finally:
            c.stop()
        wait_for(lambda: not WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING).exists(), timeout=10)
        assert lock_files(tmp_path) == []


def test_a_start_after_a_crash_removes_the_dead_clusters_lock_file(world, tmp_path):
    crashed = Cluster(tmp_path, name="crashed").start()
    try:
        assert engine_lock_held(tmp_path)
    finally:
        crashed.kill()
    assert len(lock_files(tmp_path)) == 1

    c = Cluster(tmp_path, name="after").start()
    try:
        assert engine_lock_held(tmp_path)
        assert len(lock_files(tmp_path)) == 1
    finally:
        c.stop()
    assert lock_files(tmp_path) == []
