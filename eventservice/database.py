"""DATABASES from the environment: the database URL, SQLite's options, and on PostgreSQL each
process's connection pool and the pooler in front of the server (docs/deploy.md, "Connections").

Read once by eventservice/settings.py. On PostgreSQL every process keeps its connections in
psycopg's pool (Django's `OPTIONS["pool"]`): a thread takes one for a request, a task or a loop's
life and gives it back, and a process never holds more than its pool's size. A thread that finds
none free within DB_POOL_TIMEOUT_SECONDS gets an error (the web answers 503 with `Retry-After`)
rather than waiting for ever. DB_POOL_SIZE sizes the pool of every process but qcluster's worker
processes, which size theirs when they start (workers/signals.py) from WORKER_DB_POOL_SIZE: their
engine keeps a connection for each of its threads that use the database.

Behind PgBouncer in transaction mode (DATABASE_POOLER=pgbouncer) a server connection serves one
transaction of one client, then another client's: nothing may live on it between transactions.
The agent then prepares no statement and opens no server-side cursor; its locks are
transaction-level already (`pg_advisory_xact_lock`, core/db/transactions.py) and its role locks
are files (workers/signals.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dj_database_url

from core.env import SettingsError, env_bool, env_choice, env_int, env_str

POSTGRESQL = "django.db.backends.postgresql"
POOLERS = ("none", "pgbouncer")
# Connections one web process (a gunicorn worker, runserver) or command keeps at most. A
# request holds one from its first query to its end: 4 serve gunicorn's 8 threads (a request
# spends most of its time on Python, not waiting on the database).
DB_POOL_SIZE_DEFAULT = 4
DB_POOL_TIMEOUT_DEFAULT = 10
# The threads of one qcluster worker process that use the database, each holding a connection
# while it runs: django-q2's task thread, the session heartbeat (workers/keeper.py), the engine's
# upkeep, and the nine loops of workers/loops/__init__.py (BUILT_IN) when the process holds every
# role (one worker process per cluster, or one that took the vacant roles). The attempts' and
# the deliveries' threads use none. tests/workers/test_engine_connections.py counts them.
ENGINE_DB_CONNECTIONS = 12
POOL_SIZE_MAX = 1000
# libpq's settings of every connection (docs/deploy.md, "High availability"): a server that does
# not answer within 5 s is given up (libpq's default waits for ever; with several hosts it then
# tries the next), and one that vanished without a word (its machine lost) is found dead by TCP
# keepalives within 25 s rather than the kernel's two hours.
CONNECTION_DEFAULTS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
POOL_MAX_IDLE_SECONDS = 60


def database_pooler() -> str:
    """DATABASE_POOLER: what stands between the agent and PostgreSQL (`none`, or `pgbouncer`
    in transaction mode)."""
    return env_choice("DATABASE_POOLER", "none", POOLERS)


def database_settings(data_dir: Path, *, pooler: str) -> dict[str, Any]:
    """settings.DATABASES for DATABASE_URL (SQLite in `data_dir` by default)."""
    url = env_str("DATABASE_URL", "") or f"sqlite:///{data_dir / 'event_service.db'}"
    # Read whatever the database, so that a typo fails on SQLite too.
    pool_size = env_int("DB_POOL_SIZE", DB_POOL_SIZE_DEFAULT, minimum=1, maximum=POOL_SIZE_MAX)
    pool_timeout = env_int("DB_POOL_TIMEOUT_SECONDS", DB_POOL_TIMEOUT_DEFAULT, minimum=1, maximum=300)
    try:
        default = parse_database_url(url)
    except ValueError:
        # Not the value itself in the message: it may hold a password.
        raise SettingsError(
            "DATABASE_URL is not a database URL (sqlite:///path/to/file.db, postgres://user:pw@host:5432/db,"
            " or postgres://user:pw@host1:5432,host2:5432/db?target_session_attrs=read-write)"
        ) from None
    if default["ENGINE"] == POSTGRESQL:
        _postgresql(default, pooler=pooler, pool_size=pool_size, pool_timeout=pool_timeout)
    elif pooler != "none":
        raise SettingsError(f"DATABASE_POOLER={pooler} needs a PostgreSQL DATABASE_URL (postgres://...)")
    if default["ENGINE"] == "django.db.backends.sqlite3":
        _sqlite(default)
    return {"default": default}


def parse_database_url(url: str) -> dict[str, Any]:
    """A database's Django settings from its URL; ValueError when it is none.

    A PostgreSQL URL may name several hosts (`postgres://u:pw@db1:5432,db2:5432/agent?
    target_session_attrs=read-write`): libpq tries them in turn and, with that attribute, keeps
    the one that takes writes, so that after a failover new connections find the promoted
    standby (docs/deploy.md, "High availability"). dj-database-url reads one host only; such a
    URL is read by libpq's own parser, and its query's parameters go to OPTIONS as dj-database-
    url passes them."""
    scheme, _, rest = url.partition("://")
    if scheme not in ("postgres", "postgresql") or "," not in rest.partition("/")[0]:
        try:
            return dj_database_url.parse(url, conn_max_age=600)
        except Exception:  # dj-database-url raises assorted errors for a malformed URL
            raise ValueError("not a database URL") from None
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(f"postgresql://{rest}")
    except Exception:
        raise ValueError("not a database URL") from None
    hosts, ports = params.pop("host", "").split(","), params.pop("port", "")
    if not all(hosts) or not all(port.isdigit() for port in ports.split(",") if ports) or not params.get("dbname"):
        raise ValueError("not a database URL")
    return {
        "ENGINE": POSTGRESQL,
        "NAME": params.pop("dbname"),
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": ",".join(hosts),
        "PORT": ports,
        "OPTIONS": params,
        "CONN_MAX_AGE": 600,
        "CONN_HEALTH_CHECKS": False,
        "DISABLE_SERVER_SIDE_CURSORS": False,
    }


def _postgresql(default: dict[str, Any], *, pooler: str, pool_size: int, pool_timeout: int) -> None:
    # Django refuses persistent connections beside a pool: the pool keeps them.
    default["CONN_MAX_AGE"] = 0
    # The pool checks a connection as it hands it out (an empty query): one the server dropped
    # (a restart, a failover to a standby) is replaced, where a request would have failed on it.
    default["CONN_HEALTH_CHECKS"] = True
    options = default.setdefault("OPTIONS", {})
    for name, value in CONNECTION_DEFAULTS.items():
        options.setdefault(name, value)  # a URL's own (?connect_timeout=...) stays
    options["pool"] = {
        # None is opened before a thread asks for one; one left unused for a minute is closed
        # (one a minute), so a process keeps what its threads use, up to max_size.
        "min_size": 0,
        "max_size": pool_size,
        "max_idle": POOL_MAX_IDLE_SECONDS,
        "timeout": pool_timeout,
        "name": "service-agent",
    }
    if pooler == "pgbouncer":
        # A statement prepared on one server connection is unknown to the next; a server-side
        # cursor outside a transaction would outlive it (Django's iterator() opens one).
        options["prepare_threshold"] = None
        default["DISABLE_SERVER_SIDE_CURSORS"] = True


def _sqlite(default: dict[str, Any]) -> None:
    name = Path(default["NAME"])
    try:
        name.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(
            f"cannot create {name.parent} for the SQLite database (DATA_DIR or DATABASE_URL): {exc.strerror}"
        ) from None
    # WAL lets readers run beside the single writer; IMMEDIATE makes every atomic block take
    # the write lock up front, so two writers queue on busy_timeout instead of deadlocking
    # on a read-to-write upgrade ("database is locked").
    default["CONN_MAX_AGE"] = 0 if env_bool("SQLITE_CLOSE_CONNECTIONS", False) else None
    # Django's backend, waiting for the write lock in fine steps (eventservice/sqlite/base.py).
    default["ENGINE"] = "eventservice.sqlite"
    default["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": (
            "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA foreign_keys=ON;PRAGMA busy_timeout=30000;"
        ),
    }


def worker_pool_size(*, engine_enabled: bool) -> int:
    """WORKER_DB_POOL_SIZE: the pool of each qcluster worker process. With the engine, at least
    one connection for each of its threads that use the database; without, django-q2's task
    thread alone needs one."""
    minimum = ENGINE_DB_CONNECTIONS if engine_enabled else 1
    size = env_int("WORKER_DB_POOL_SIZE", ENGINE_DB_CONNECTIONS, minimum=1, maximum=POOL_SIZE_MAX)
    if size < minimum:
        raise SettingsError(
            f"WORKER_DB_POOL_SIZE must be at least {minimum}, got {size}: a worker process's engine keeps a "
            f"connection for each of its {minimum} threads that use the database (docs/deploy.md, 'Connections')"
        )
    return size
