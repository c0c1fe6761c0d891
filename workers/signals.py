"""Hosting the engines inside `manage.py qcluster`.

django-q2 sends `post_spawn` in every worker process it starts. Each worker process opens a
worker session with a heartbeat (attempts made by its tasks belong to it) and runs an engine
in background threads: every engine executes attempts (docs/architecture.md, "Every worker
process executes"). Two roles are one per cluster, each held by a lock file:
- the timer home (the precise timer, the watchdog, flow control, schedules): the first worker
  to take the cluster's `engine` lock;
- the events home (the outbox dispatcher, delivery to subscribers): the first *other* worker
  to take the cluster's `events` lock, so the events have a core of their own during a burst;
  with one worker process per cluster, the timer home holds both.
The OS releases a lock when its process dies, so the worker django-q2 spawns to replace it
takes the role over; and every engine looks for a vacant role every 2 s (a replacement spawned
before its predecessor was gone found the lock still held). Several clusters coordinate through the database's conditional updates.

The lock files are named after the cluster's sentinel process, so they are new at every
start: the holder deletes its file when it stops cleanly, and a worker taking a lock deletes
the files of this host's clusters that died without cleaning up (no process holds their lock
any more). Deleting is done under the lock, and a taker checks that the file it locked is
still the one at that path, so a lock on a deleted file never counts.
"""

from __future__ import annotations

import fcntl
import gc
import logging
import multiprocessing.util
import os
import socket
from pathlib import Path

from django.conf import settings
from django.dispatch import receiver
from django_q.signals import post_spawn

from core.db import pool_resize

logger = logging.getLogger("serviceagent.engine")

keeper = None
engine = None
_lock_files: dict[str, object] = {}


def _lock_path(role: str) -> Path:
    return settings.DATA_DIR / f"{role}-{socket.gethostname()}-{os.getppid()}.lock"


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


def _remove_dead_cluster_locks(role: str, own: Path) -> None:
    for path in own.parent.glob(f"{role}-{socket.gethostname()}-*.lock"):
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


def _take_cluster_lock(role: str) -> bool:
    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    path = _lock_path(role)
    _remove_dead_cluster_locks(role, path)
    while True:
        handle = _lock(path)
        if handle is None:
            return False
        if _still_linked(handle, path):
            _lock_files[role] = handle
            return True
        # Deleted by its previous holder between our open and flock: lock the new file.
        handle.close()


def _release_cluster_locks() -> None:
    for role in list(_lock_files):
        handle = _lock_files.pop(role)
        # Delete before unlocking: whoever locks the old file afterwards sees it is gone.
        Path(handle.name).unlink(missing_ok=True)
        handle.close()


def _roles() -> tuple[bool, bool]:
    """(timer home, events home) for this worker process: the locks it could take."""
    timer = _take_cluster_lock("engine")
    if timer and settings.Q_CLUSTER.get("workers", 1) > 1:
        return True, False  # the events home is another worker's
    return timer, _take_cluster_lock("events")


def _shutdown() -> None:
    if engine is not None:
        engine.stop()
        _release_cluster_locks()
    if keeper is not None:
        keeper.close()


@receiver(post_spawn)
def on_worker_spawn(sender, proc_name: str, **kwargs) -> None:
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    global keeper, engine
    # On PostgreSQL, this process's pool holds a connection for each of its threads that use the
    # database (WORKER_DB_POOL_SIZE); the cluster's other processes keep DB_POOL_SIZE's
    # (docs/deploy.md, "Connections").
    pool_resize(settings.WORKER_DB_POOL_SIZE)
    keeper = SessionKeeper()
    # multiprocessing children skip atexit; its finalizers run when a worker exits cleanly.
    multiprocessing.util.Finalize(None, _shutdown, exitpriority=100)
    if settings.ENGINE_ENABLED:
        timer, events = _roles()
        logger.info(
            "this worker runs an engine",
            extra={"workerProcess": proc_name, "pid": os.getpid(), "timer": timer, "events": events},
        )
        engine = Engine(
            keeper,
            timer=timer,
            events=events,
            take_role=_take_cluster_lock,
            single_worker=settings.Q_CLUSTER.get("workers", 1) <= 1,
        )
        # What the process holds by now (Django, the modules, the engine) lives as long as it:
        # out of the collector's way, whose full passes over it held the GIL 20-45 ms at a time
        # under load, every thread of the process stopped meanwhile (bench/HISTORY.md, "The
        # next-due look stops short of the parked notifications").
        gc.freeze()
        engine.start()


def current_worker_id() -> str:
    """The session of this worker process (tasks' attempts belong to it)."""
    if keeper is None:
        raise RuntimeError("not inside a qcluster worker (no worker session)")
    return keeper.session_id
