"""Real `manage.py qcluster` processes for tests, on the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

from tests.support.agent_process import on_its_database
from workers.models import WorkerSession

ROOT = Path(settings.BASE_DIR)


def database_url() -> str:
    """The URL of the database this test runs on (the pytest-django test database)."""
    s = connection.settings_dict
    if s["ENGINE"] in ("django.db.backends.sqlite3", "eventservice.sqlite"):
        return f"sqlite:///{s['NAME']}"
    if s["ENGINE"] == "django.db.backends.postgresql":
        auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "") + "@" if s.get("USER") else ""
        return f"postgres://{auth}{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"
    raise RuntimeError(f"unsupported engine {s['ENGINE']}")


def direct_database_url() -> str:
    """The test database on PostgreSQL itself: behind PgBouncer (scripts/test's pass through it
    sets DATABASE_DIRECT_URL), that server with this test database's name; else database_url()."""
    direct = os.environ.get("DATABASE_DIRECT_URL", "")
    if not direct:
        return database_url()
    return f"{direct.rsplit('/', 1)[0]}/{connection.settings_dict['NAME']}"


class Cluster:
    """One qcluster (sentinel, workers, pusher, monitor) in its own process group."""

    def __init__(self, data_dir: Path, *, name: str = "c1", **env: str) -> None:
        self.data_dir = data_dir
        self.name = name
        self.extra_env = env
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir / f"qcluster-{name}.log"

    def env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST"))}
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "eventservice.settings",
                "DATABASE_URL": database_url(),
                "DATA_DIR": str(self.data_dir),
                "ENGINE_ENABLED": "true",
                "EGRESS_ALLOWLIST": "127.0.0.0/8,::1",
                "WORKER_HEARTBEAT_SECONDS": "1",
                "WORKER_STALE_SECONDS": "3",
                "WATCHDOG_GRACE_MS": "2000",
                "Q_WORKERS": "2",
                "LOG_LEVEL": "WARNING",
                "EVENT_LOG_LEVEL": "WARNING",
                "PYTHONPATH": str(ROOT),
            }
        )
        env.update(self.extra_env)
        return on_its_database(env)

    def start(self, *, wait: bool = True, timeout: float = 30.0) -> Cluster:
        started = time.time()
        log = open(self.log_path, "a")  # noqa: SIM115 - the child writes to it
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "qcluster"],
            cwd=ROOT,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        if wait:
            try:
                self.wait_ready(since=started, timeout=timeout)
            except BaseException:  # not ready (or the test's own query failed): none left running
                self.kill()
                raise
        return self

    def wait_ready(self, *, since: float, timeout: float) -> None:
        """Ready when a worker session of this cluster's processes is beating."""
        from datetime import UTC, datetime

        deadline = time.monotonic() + timeout
        since_dt = datetime.fromtimestamp(since, UTC)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"qcluster exited early:\n{self.log()}")
            if WorkerSession.objects.filter(started_at__gte=since_dt, status=WorkerSession.Status.RUNNING).exists():
                return
            time.sleep(0.1)
        raise RuntimeError(f"qcluster not ready within {timeout}s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL the whole cluster: sentinel, workers, pusher and monitor at once."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        try:
            # Only the main process: django-q2 then stops its workers cleanly.
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass
        self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except FileNotFoundError:
            return ""
