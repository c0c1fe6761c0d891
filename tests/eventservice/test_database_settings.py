"""DATABASES from the environment (eventservice/database.py; docs/deploy.md, "Connections"): on
PostgreSQL every process pools its connections, sized and timed by the settings; behind
PgBouncer no statement is prepared and no server-side cursor opened; a bad value is refused with
one line naming it, by `manage.py` for real."""

from __future__ import annotations

import pytest

from core.env import SettingsError
from eventservice.database import (
    DB_POOL_SIZE_DEFAULT,
    DB_POOL_TIMEOUT_DEFAULT,
    ENGINE_DB_CONNECTIONS,
    database_pooler,
    database_settings,
    worker_pool_size,
)
from tests.support.agent_process import agent_env, manage

POSTGRES = "postgres://agent:pw@db.internal:5432/agent"
NAMES = ("DATABASE_URL", "DATABASE_POOLER", "DB_POOL_SIZE", "DB_POOL_TIMEOUT_SECONDS", "WORKER_DB_POOL_SIZE")


@pytest.fixture
def environ(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _default(tmp_path) -> dict:
    return database_settings(tmp_path, pooler=database_pooler())["default"]


def test_on_postgresql_each_process_pools_its_connections(environ, tmp_path):
    environ.setenv("DATABASE_URL", POSTGRES)
    default = _default(tmp_path)
    assert default["ENGINE"] == "django.db.backends.postgresql"
    # Django refuses persistent connections beside a pool.
    assert default["CONN_MAX_AGE"] == 0
    pool = default["OPTIONS"]["pool"]
    assert (pool["min_size"], pool["max_size"], pool["timeout"]) == (0, DB_POOL_SIZE_DEFAULT, DB_POOL_TIMEOUT_DEFAULT)
    assert (DB_POOL_SIZE_DEFAULT, DB_POOL_TIMEOUT_DEFAULT) == (4, 10)  # as the README and docs/deploy.md say
    assert "prepare_threshold" not in default["OPTIONS"] and not default["DISABLE_SERVER_SIDE_CURSORS"]


def test_the_pool_takes_its_size_and_timeout_from_the_environment(environ, tmp_path):
    environ.setenv("DATABASE_URL", POSTGRES)
    environ.setenv("DB_POOL_SIZE", "7")
    environ.setenv("DB_POOL_TIMEOUT_SECONDS", "3")
    pool = _default(tmp_path)["OPTIONS"]["pool"]
    assert (pool["max_size"], pool["timeout"]) == (7, 3)


def test_behind_pgbouncer_nothing_lives_on_a_server_connection_between_transactions(environ, tmp_path):
    environ.setenv("DATABASE_URL", POSTGRES.replace("5432", "6432"))
    environ.setenv("DATABASE_POOLER", "PgBouncer")  # a choice, whatever its case
    default = _default(tmp_path)
    assert default["OPTIONS"]["prepare_threshold"] is None
    assert default["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert default["OPTIONS"]["pool"]["max_size"] == DB_POOL_SIZE_DEFAULT  # each process still pools


def test_a_url_may_name_several_hosts_and_keep_the_one_that_takes_writes(environ, tmp_path):
    # docs/deploy.md, "High availability": libpq tries the hosts in turn.
    environ.setenv(
        "DATABASE_URL",
        "postgres://agent:p%40ss@db1.internal:5432,db2.internal:5433/agent"
        "?target_session_attrs=read-write&connect_timeout=3",
    )
    default = _default(tmp_path)
    assert default["ENGINE"] == "django.db.backends.postgresql"
    assert (default["HOST"], default["PORT"]) == ("db1.internal,db2.internal", "5432,5433")
    assert (default["NAME"], default["USER"], default["PASSWORD"]) == ("agent", "agent", "p@ss")
    assert default["OPTIONS"]["target_session_attrs"] == "read-write"
    assert default["OPTIONS"]["connect_timeout"] == "3"  # the URL's own
    assert default["OPTIONS"]["keepalives_idle"] == 10  # a host lost without a word is found dead
    assert default["OPTIONS"]["pool"]["max_size"] == DB_POOL_SIZE_DEFAULT  # pooled as one host is
    # What psycopg connects with: every host and port, in order.
    from django.db.backends.postgresql.base import DatabaseWrapper

    params = DatabaseWrapper({**default, "TIME_ZONE": None, "AUTOCOMMIT": True}).get_connection_params()
    assert (params["host"], params["port"], params["target_session_attrs"]) == (
        "db1.internal,db2.internal",
        "5432,5433",
        "read-write",
    )


@pytest.mark.parametrize(
    "url",
    [
        "postgres://agent@db1:5432,db2:fivefourthreetwo/agent",
        "postgres://agent@db1:5432,/agent",
        "postgres://agent@db1,db2",  # no database
    ],
)
def test_a_bad_url_of_several_hosts_is_refused(environ, tmp_path, url):
    environ.setenv("DATABASE_URL", url)
    with pytest.raises(SettingsError, match="DATABASE_URL is not a database URL"):
        _default(tmp_path)


def test_sqlite_keeps_its_connection_and_has_no_pool(environ, tmp_path):
    default = _default(tmp_path)
    assert default["ENGINE"] == "eventservice.sqlite"
    assert "pool" not in default["OPTIONS"]


@pytest.mark.parametrize(
    "changes,named",
    [
        ({"DATABASE_POOLER": "pgbouncer"}, "DATABASE_POOLER=pgbouncer needs a PostgreSQL DATABASE_URL"),
        ({"DATABASE_URL": POSTGRES, "DATABASE_POOLER": "pgpool"}, "DATABASE_POOLER must be one of none, pgbouncer"),
        ({"DATABASE_URL": POSTGRES, "DB_POOL_SIZE": "0"}, "DB_POOL_SIZE must be >= 1"),
        ({"DATABASE_URL": POSTGRES, "DB_POOL_SIZE": "four"}, "DB_POOL_SIZE must be an integer"),
        ({"DATABASE_URL": POSTGRES, "DB_POOL_SIZE": "1001"}, "DB_POOL_SIZE must be <= 1000"),
        ({"DATABASE_URL": POSTGRES, "DB_POOL_TIMEOUT_SECONDS": "0"}, "DB_POOL_TIMEOUT_SECONDS must be >= 1"),
        # Read on SQLite too: a typo fails before the move to PostgreSQL.
        ({"DB_POOL_SIZE": "-1"}, "DB_POOL_SIZE must be >= 1"),
    ],
)
def test_a_bad_value_is_refused_naming_it(environ, tmp_path, changes, named):
    for name, value in changes.items():
        environ.setenv(name, value)
    with pytest.raises(SettingsError, match=named):
        database_settings(tmp_path, pooler=database_pooler())


def test_a_worker_pool_holds_a_connection_for_each_engine_thread(environ):
    assert worker_pool_size(engine_enabled=True) == ENGINE_DB_CONNECTIONS == 12
    environ.setenv("WORKER_DB_POOL_SIZE", "16")
    assert worker_pool_size(engine_enabled=True) == 16
    environ.setenv("WORKER_DB_POOL_SIZE", "11")
    with pytest.raises(SettingsError, match=r"WORKER_DB_POOL_SIZE must be at least 12, got 11: .* 12 threads"):
        worker_pool_size(engine_enabled=True)
    # django-q2's tasks alone need one.
    environ.setenv("WORKER_DB_POOL_SIZE", "1")
    assert worker_pool_size(engine_enabled=False) == 1


@pytest.mark.parametrize(
    "name,value",
    [
        ("DB_POOL_SIZE", "0"),
        ("WORKER_DB_POOL_SIZE", "4"),
        ("DATABASE_POOLER", "pgpool"),
        ("DB_POOL_TIMEOUT_SECONDS", "x"),
    ],
)
def test_manage_py_stops_with_one_line_naming_the_variable(tmp_path, name, value):
    # A PostgreSQL URL (the settings refuse before any connection is made).
    result = manage(agent_env(tmp_path, SECRET_KEY="k" * 50, DATABASE_URL=POSTGRES, **{name: value}), "check")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Service Agent cannot start: ")
    assert name in result.stderr
