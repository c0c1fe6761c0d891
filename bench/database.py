"""`--database postgres`: a scratch PostgreSQL database for one run, made at its start and
dropped at its end (also on Ctrl-C, SIGTERM or an error).

The server is BENCH_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/, trust auth);
the run's database is `bench_<hex>` on it, and every process of the run gets DATABASE_URL
pointing there (eventservice/settings.py reads it with dj-database-url).
"""

from __future__ import annotations

import os
import secrets
from urllib.parse import urlsplit, urlunsplit

from bench.common import log

POSTGRES_URL = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/")


def without_password(url: str) -> str:
    """The URL as it may be shown: no password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class ScratchPostgres:
    """One throwaway database on the server at `server_url`."""

    def __init__(self, server_url: str = POSTGRES_URL) -> None:
        self.server_url = server_url
        self.name = f"bench_{secrets.token_hex(4)}"
        self.url = urlunsplit(urlsplit(server_url)._replace(path=f"/{self.name}"))
        self.created = False
        self.server_version = ""

    def _connect(self):
        import psycopg

        # The server URL's own database (or the user's name when it names none), never ours.
        return psycopg.connect(self.server_url, connect_timeout=3, autocommit=True)

    def unreachable_reason(self) -> str | None:
        """None when the server answers and lets this user create databases; else why not."""
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return "psycopg is not installed (pip install -r requirements.txt)"
        shown = without_password(self.server_url)
        try:
            with self._connect() as conn:
                self.server_version = conn.execute("SHOW server_version").fetchone()[0]
                may = conn.execute(
                    "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user"
                ).fetchone()
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            return f"PostgreSQL unreachable at {shown} ({type(exc).__name__}: {first}); BENCH_POSTGRES_URL sets another"
        if not may or not may[0]:
            return f"the user of {shown} may not create databases (CREATEDB)"
        return None

    def create(self) -> None:
        with self._connect() as conn:
            self.server_version = conn.execute("SHOW server_version").fetchone()[0]
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.created = True
        log(f"postgres: scratch database {self.name} on {without_password(self.server_url)}")

    def vacuum_analyze(self) -> None:
        import psycopg

        with psycopg.connect(self.url, connect_timeout=3, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")

    def drop(self) -> None:
        """Drop the database (idempotent); connections left open to it are ended (WITH FORCE)."""
        if not self.created:
            return
        try:
            from django.db import connections

            connections.close_all()
        except Exception:
            pass
        try:
            with self._connect() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            self.created = False
            log(f"postgres: scratch database {self.name} dropped")
        except Exception as exc:
            log(f"postgres: could not drop {self.name}: {type(exc).__name__}: {exc}")
