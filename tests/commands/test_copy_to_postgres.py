"""manage.py copy_to_postgres: a real agent on SQLite, with calls run by its workers and their
events delivered, moves to an empty PostgreSQL database, and then runs a call there whose events
are still signed with the subscription's sealed secret (docs/deploy.md, "Moving from SQLite to
PostgreSQL")."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid

import pytest

from tests.delivery.receivers import receiving
from tests.support.agent_process import ROOT, agent_env, manage
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster

pytestmark = [pytest.mark.workers]

SERVER = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/service_agent").rsplit("/", 1)[0]
# Tables whose rows the copy must carry over, compared one by one.
TABLES = (
    "tenants",
    "auth_user",
    "tenant_memberships",
    "tenant_api_keys",
    "service_calls",
    "service_call_tags",
    "timer_schedules",
    "http_execution_log",
    "outbox",
    "outbox_feed_counters",
    "subscriptions",
    "event_notifications",
    "event_delivery_attempts",
)


def _postgres(sql: str, database: str = "postgres") -> list[tuple]:
    import psycopg

    with psycopg.connect(f"{SERVER.replace('postgres://', 'postgresql://', 1)}/{database}", autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def empty_database():
    reachable = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "reachable.py"), "postgres", f"{SERVER}/postgres"],
        capture_output=True,
        text=True,
    )
    if reachable.returncode:
        pytest.skip(f"needs a PostgreSQL server at {SERVER} (TEST_POSTGRES_URL): {reachable.stderr.strip()}")
    name = f"sa_copy_{uuid.uuid4().hex[:12]}"
    _postgres(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        _postgres(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _counts_sqlite(path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in TABLES}


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_real_agent_moves_to_postgres_and_runs_a_call_there(tmp_path, empty_database):
    sqlite_dir = tmp_path / "sqlite"
    sqlite_dir.mkdir()
    env = agent_env(sqlite_dir, EGRESS_ALLOWLIST="127.0.0.0/8,::1", LOG_LEVEL="ERROR")
    target_url = f"{SERVER}/{empty_database}"
    with receiving() as receiver:
        _ok(manage(env, "migrate", "-v0"))
        _ok(manage(env, "create_tenant", "acme"))
        _ok(manage(env, "create_api_key", "acme", "--label", "moved"))
        created = _ok(manage(env, "create_subscription", "--tenant", "acme", "--name", "hook", "--url", receiver.url()))
        receiver.secrets.append(created.strip().splitlines()[-1])
        for n in range(3):
            _ok(manage(env, "submit_call", "--tenant", "acme", "--name", f"before {n}", "--method", "POST",
                       "--url", receiver.url(f"/call/{n}"), "--tag", "moved"))  # fmt: skip
        sqlite_path = sqlite_dir / "event_service.db"
        cluster = Cluster(sqlite_dir, name="sqlite", DATABASE_URL=f"sqlite:///{sqlite_path}")
        cluster.env = lambda: {**env, **{"ENGINE_ENABLED": "true", "Q_WORKERS": "1"}}  # the agent's own env
        cluster.start(wait=False)
        try:
            wait_for(lambda: len(receiver.at("/ok")) >= 3 * 4, timeout=60, interval=0.25)
            # A running agent is refused: its writes during the copy would be missed.
            refused = manage(env, "copy_to_postgres", target_url)
            assert refused.returncode == 1
            assert "the agent is running" in refused.stderr
        finally:
            cluster.stop()
        before = _counts_sqlite(sqlite_path)
        assert before["http_execution_log"] == 3 and before["event_delivery_attempts"] >= 12
        # A loop run of five days ago: on PostgreSQL the history is partitioned by day, and the
        # copy makes the partitions of the days its rows were made on (docs/schema.md).
        with sqlite3.connect(sqlite_path) as conn:
            conn.execute(
                "UPDATE worker_loop_runs SET started_at = datetime(started_at, '-5 days') "
                "WHERE id = (SELECT min(id) FROM worker_loop_runs)"
            )
            (old_day,) = conn.execute("SELECT date(min(started_at)) FROM worker_loop_runs").fetchone()

        out = _ok(manage(env, "copy_to_postgres", target_url))
        assert "every count checked" in out
        after = {table: _postgres(f"SELECT COUNT(*) FROM {table}", empty_database)[0][0] for table in TABLES}
        assert after == before
        old = "SELECT DISTINCT tableoid::regclass::text FROM worker_loop_runs WHERE started_at < now() - interval '4 days'"
        assert _postgres(old, empty_database) == [(f"worker_loop_runs_p{old_day.replace('-', '')}",)]
        for table in ("outbox", "event_notifications", "event_delivery_attempts", "worker_loop_runs"):
            assert _postgres(f"SELECT COUNT(*) FROM ONLY {table}_default", empty_database) == [(0,)], table
        again = manage(env, "copy_to_postgres", target_url)
        assert again.returncode == 1 and "not empty" in again.stderr

        # The agent on PostgreSQL: same keys, the moved data, and new work.
        pg_dir = tmp_path / "pg"
        pg_dir.mkdir()
        pg_env = {**env, "DATABASE_URL": target_url, "DATA_DIR": str(pg_dir)}
        listed = _ok(manage(pg_env, "list_calls", "--tenant", "acme", "--tag", "moved"))
        assert listed.count("Succeeded") == 3
        new_id = _ok(manage(pg_env, "submit_call", "--tenant", "acme", "--name", "after", "--method", "POST",
                            "--url", receiver.url("/call/after"))).strip()  # fmt: skip
        on_pg = Cluster(pg_dir, name="pg")
        on_pg.env = lambda: {**pg_env, "ENGINE_ENABLED": "true", "Q_WORKERS": "1"}
        on_pg.start(wait=False)
        try:
            wait_for(
                lambda: (
                    _postgres(f"SELECT status FROM service_calls WHERE service_call_id = '{new_id}'", empty_database)
                    == [("Succeeded",)]
                ),
                timeout=60,
                interval=0.25,
            )
            wait_for(lambda: len(receiver.at("/ok")) >= 4 * 4, timeout=60, interval=0.25)
        finally:
            on_pg.stop()
    # The new call's events were signed with the secret sealed on SQLite, and no event twice.
    deliveries = receiver.at("/ok")
    assert all(d.verified_with for d in deliveries)
    ids = [d.headers["webhook-id"] for d in deliveries]
    assert len(ids) == len(set(ids)) == 16
