"""The connection pool of a process on PostgreSQL (docs/deploy.md, "Connections").

Django keeps one psycopg pool per process and database alias (its settings:
eventservice/database.py). What this module adds to it:
- `pool_resize`: a process sizes its pool before its first connection (a qcluster worker process
  at spawn, workers/signals.py: its engine needs more than a web process);
- `pool_release`: a thread gives its connection back before it waits for another thread
  (core/db/transactions.py, group_commit's followers);
- a thread that ends while it holds a pooled connection gives it back. psycopg's pool counts a
  connection nobody returned as in use for ever: without this, every such thread would shrink
  the pool by one until no thread of the process could get a connection;
- a process about to fork closes its pool (its idle connections at once, the others as they come
  back), and the forked process forgets the connections it inherited, without closing them
  (they are its parent's: a close would end the parent's sessions), and makes its own pool.
  django-q2 forks its worker processes, pusher and monitor from a process that may have used
  the database;
- `is_pool_timeout`: what a thread gets when no connection came free in time (the web answers
  503 to it: eventservice/middleware.py and eventservice/api/errors.py).
`pool_install` sets up the give-back at a thread's end and the fork's hooks; eventservice/apps.py
calls it in every process.

A web process has fewer connections than threads, so a thread may wait for one; two rules keep
such waits from closing a circle: a thread gives its connection back before it waits for another
thread (`pool_release`), and takes its connection before a lock under which it queries (the
request ceilings' counts, the cached ceilings and limited tenants), so that the lock's holder
never waits for the pool while the threads waiting for the lock hold its connections. A worker
process has a connection for each of its threads (WORKER_DB_POOL_SIZE): none of them waits.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from django.db import DEFAULT_DB_ALIAS, OperationalError, connections
from django.db.backends.signals import connection_created

_POSTGRESQL_BASE = "django.db.backends.postgresql.base"


def pool_options(alias: str = DEFAULT_DB_ALIAS) -> dict[str, Any] | None:
    """The pool's options of `alias` (None: its connections are not pooled)."""
    return connections.settings[alias].get("OPTIONS", {}).get("pool") or None


def pool_resize(max_size: int, alias: str = DEFAULT_DB_ALIAS) -> None:
    """This process's pool of `alias` holds at most `max_size` connections from now on. Called
    before the process's threads use the database: a pool made already is closed (the
    connections checked out of it are closed as they come back)."""
    options = pool_options(alias)
    if options is None or options.get("max_size") == max_size:
        return
    connections.settings[alias]["OPTIONS"]["pool"] = {**options, "max_size": max_size}
    base = sys.modules.get(_POSTGRESQL_BASE)
    if base is not None and alias in base.DatabaseWrapper._connection_pools:
        connections[alias].close()
        connections[alias].close_pool()


def pool_release(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Give this thread's pooled connection back before it waits for another thread: one that
    held it while waiting for a thread that needs a connection could leave that thread none
    (every connection held by a waiter). Outside a transaction only; a connection not pooled
    is kept (closing it would cost a new one)."""
    wrapper = connections[alias]
    if wrapper.connection is not None and not wrapper.in_atomic_block and pool_options(alias) is not None:
        wrapper.close()


def is_pool_timeout(exc: BaseException) -> bool:
    """Whether `exc` says that no pooled connection came free within DB_POOL_TIMEOUT_SECONDS.
    psycopg_pool not imported (SQLite: every process would pay a tenth of a second for it): no pool
    has timed out."""
    pool = sys.modules.get("psycopg_pool")
    if pool is None:
        return False
    return isinstance(exc, pool.PoolTimeout) or (
        isinstance(exc, OperationalError) and isinstance(exc.__cause__, pool.PoolTimeout)
    )


class _GivenBackAtThreadEnd:
    """Lives in the local storage of a thread that took a pooled connection; when the thread
    ends, a connection its database wrappers still hold goes back to its pool."""

    def __init__(self) -> None:
        self.wrappers: list[Any] = []

    def note(self, wrapper: Any) -> None:
        if not any(seen is wrapper for seen in self.wrappers):
            self.wrappers.append(wrapper)

    def __del__(self) -> None:
        for wrapper in self.wrappers:
            raw = wrapper.connection
            pool = getattr(raw, "_pool", None)
            if raw is None or pool is None:
                continue  # closed as it should be: back in the pool already
            wrapper.connection = None
            try:
                pool.putconn(raw)  # rolls back what the thread left open
            except Exception:  # a pool closed meanwhile: nothing to give back to  # noqa: S110
                pass


_threads = threading.local()


def _note_pooled_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor != "postgresql" or not connection.settings_dict.get("OPTIONS", {}).get("pool"):
        return
    holder = getattr(_threads, "holder", None)
    if holder is None:
        holder = _threads.holder = _GivenBackAtThreadEnd()
    holder.note(connection)


def _close_before_fork() -> None:
    base = sys.modules.get(_POSTGRESQL_BASE)
    if base is None:
        return
    # The idle connections now, the ones in use as they come back: the child forgets them
    # anyway, and the parent makes a new pool when it needs one (django-q2's sentinel forks
    # its processes after its last query; a pool would keep its connection open for nothing).
    for alias in list(base.DatabaseWrapper._connection_pools):
        pool = base.DatabaseWrapper._connection_pools.pop(alias)
        try:
            pool.close(timeout=1)
        except Exception:  # the pool's own threads stuck: its connections stay the parent's  # noqa: S110
            pass


def _forget_after_fork() -> None:
    base = sys.modules.get(_POSTGRESQL_BASE)
    if base is None:
        return  # nothing of PostgreSQL was used before the fork
    # The forking thread's wrappers: their connections are the parent's.
    for wrapper in connections.all(initialized_only=True):
        if wrapper.vendor == "postgresql":
            wrapper.connection = None
    base.DatabaseWrapper._connection_pools.clear()
    holder = getattr(_threads, "holder", None)
    if holder is not None:
        holder.wrappers.clear()


_installed = False


def pool_install() -> None:
    """Give back at thread end, close before a fork and forget after it (once per process; the
    fork hooks carry over into the forked processes)."""
    global _installed
    if _installed:
        return
    _installed = True
    connection_created.connect(_note_pooled_connection, dispatch_uid="core.db.pool")
    os.register_at_fork(before=_close_before_fork, after_in_child=_forget_after_fork)
