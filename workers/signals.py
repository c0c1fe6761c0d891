"""Hosting the engine inside `manage.py qcluster`.

django-q2 sends `post_spawn` in every worker process it starts. Each worker process opens a
worker session with a heartbeat (attempts made by its tasks belong to it). The first worker
of a cluster to take the cluster's lock file also runs the engine in background threads; the
OS releases the lock when that process dies, so the worker django-q2 spawns to replace it
takes over. One engine per cluster; several clusters coordinate through the database's
conditional updates.

The lock file is named after the cluster's sentinel process, so it is new at every start:
the holder deletes it when it stops cleanly, and a worker taking its own cluster's lock
deletes the files of this host's clusters that died without cleaning up (no process holds
their lock any more). Deleting is done under the lock, and a taker checks that the file it
locked is still the one at that path, so a lock on a deleted file never counts.
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing.util
import os
import socket
from pathlib import Path

from django.conf import settings
from django.dispatch import receiver
from django_q.signals import post_spawn

logger = logging.getLogger("serviceagent.engine")

keeper = None
engine = None
_lock_file = None


def _lock_path() -> Path:
    return settings.DATA_DIR / f"engine-{socket.gethostname()}-{os.getppid()}.lock"


def _lock(path: Path):
    """An open handle on path holding its flock, or None when another process holds it."""
    handle = open(path, "a")  # noqa: SIM115 - held for the life of the process
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def _still_linked(handle, path: Path) -> bool:
    """Whether path still names the file handle has open (not deleted by its last holder)."""
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _remove_dead_cluster_locks(own: Path) -> None:
    for path in own.parent.glob(f"engine-{socket.gethostname()}-*.lock"):
        if path == own:
            continue
        handle = _lock(path)
        if handle is None:
            continue  # a live cluster's engine holds it
        try:
            if _still_linked(handle, path):
                path.unlink(missing_ok=True)
        finally:
            handle.close()


def _take_cluster_lock() -> bool:
    global _lock_file
    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    path = _lock_path()
    _remove_dead_cluster_locks(path)
    while True:
        handle = _lock(path)
        if handle is None:
            return False
        if _still_linked(handle, path):
            _lock_file = handle
            return True
        # Deleted by its previous holder between our open and flock: lock the new file.
        handle.close()


def _release_cluster_lock() -> None:
    global _lock_file
    if _lock_file is None:
        return
    # Delete before unlocking: whoever locks the old file afterwards sees it is gone.
    Path(_lock_file.name).unlink(missing_ok=True)
    _lock_file.close()
    _lock_file = None


def _shutdown() -> None:
    if engine is not None:
        engine.stop()
        _release_cluster_lock()
    if keeper is not None:
        keeper.close()


@receiver(post_spawn)
def on_worker_spawn(sender, proc_name: str, **kwargs) -> None:
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    global keeper, engine
    keeper = SessionKeeper()
    # multiprocessing children skip atexit; its finalizers run when a worker exits cleanly.
    multiprocessing.util.Finalize(None, _shutdown, exitpriority=100)
    if settings.ENGINE_ENABLED and _take_cluster_lock():
        logger.info("this worker hosts the engine", extra={"workerProcess": proc_name, "pid": os.getpid()})
        engine = Engine(keeper)
        engine.start()


def current_worker_id() -> str:
    """The session of this worker process (tasks' attempts belong to it)."""
    if keeper is None:
        raise RuntimeError("not inside a qcluster worker (no worker session)")
    return keeper.session_id
