"""Each process's connection pool on PostgreSQL (core/db/pool.py; docs/deploy.md, "Connections"),
in a real `manage.py shell` process on the test database: a thread that ends holding a
connection gives it back, a forked process never uses its parent's connections, and a worker
process sizes its pool for its engine's threads before they start."""

from __future__ import annotations

import textwrap

import pytest

from tests.support.agent_process import agent_env, manage
from tests.workers.cluster import database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _shell(tmp_path, script: str, **env: str) -> list[str]:
    result = manage(
        agent_env(tmp_path, DATABASE_URL=database_url(), **env),
        "shell",
        "-v0",
        "-c",
        textwrap.dedent(script),
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split()


def test_threads_that_end_holding_their_connection_leave_the_pool_whole(tmp_path):
    # One connection in the pool, a second's wait: a thread that ended without closing its
    # connection would hold it for ever, and the next thread would time out.
    out = _shell(
        tmp_path,
        """
        import threading
        from django.db import connection

        def use():
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")

        done = []
        for _ in range(3):
            thread = threading.Thread(target=lambda: done.append(use()))
            thread.start()
            thread.join()
        use()
        print(len(done), connection.pool.get_stats()["pool_size"])
        """,
        DB_POOL_SIZE="1",
        DB_POOL_TIMEOUT_SECONDS="1",
    )
    assert out == ["3", "1"]


def test_a_forked_process_never_uses_its_parents_connections(tmp_path):
    out = _shell(
        tmp_path,
        """
        import os, socket
        from django.db import connection

        def backend():
            # The connection's own socket (its local port): behind PgBouncer, two connections
            # can be served by one server process.
            connection.ensure_connection()
            with socket.socket(fileno=os.dup(connection.connection.fileno())) as sock:
                return sock.getsockname()[1]

        parent = backend()
        connection.close()  # back in the pool, open and idle: what a fork would inherit
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, str(backend()).encode())
            os._exit(0)
        os.close(write)
        child = int(os.read(read, 64))
        os.waitpid(pid, 0)
        print(parent, child, backend())
        """,
    )
    parent, child, after = (int(pid) for pid in out)
    # The child made its own; the parent goes on (its pool was closed before the fork).
    assert child != parent and after != child


def test_a_worker_process_sizes_its_pool_for_its_engine_before_its_threads_start(tmp_path):
    out = _shell(
        tmp_path,
        """
        from django.conf import settings
        from django.db import connection
        from core.db import pool_options, pool_resize

        connection.ensure_connection()  # a pool made already, with DB_POOL_SIZE's size
        before = connection.pool.max_size
        pool_resize(settings.WORKER_DB_POOL_SIZE)
        connection.ensure_connection()
        print(before, pool_options()["max_size"], connection.pool.max_size)
        """,
    )
    assert out == ["4", "12", "12"]
