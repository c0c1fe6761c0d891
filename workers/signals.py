"""Hosting the engine inside `manage.py qcluster`.

django-q2 sends `post_spawn` in every worker process it starts. Each worker process opens a
worker session with a heartbeat (attempts made by its tasks belong to it). The first worker
of a cluster to take the cluster's lock file also runs the engine in background threads; the
OS releases the lock when that process dies, so the worker django-q2 spawns to replace it
takes over. One engine per cluster; several clusters coordinate through the database's
conditional updates.
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing.util
import os
import socket

from django.conf import settings
from django.dispatch import receiver
from django_q.signals import post_spawn

logger = logging.getLogger("serviceagent.engine")

keeper = None
engine = None
_lock_file = None


def _take_cluster_lock() -> bool:
    global _lock_file
    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    path = settings.DATA_DIR / f"engine-{socket.gethostname()}-{os.getppid()}.lock"
    handle = open(path, "w")  # noqa: SIM115 - held for the life of the process
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _lock_file = handle
    return True


def _shutdown() -> None:
    if engine is not None:
        engine.stop()
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
