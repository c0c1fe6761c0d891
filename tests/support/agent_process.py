"""The agent as a real process for tests: its environment, `manage.py`, and gunicorn or
`manage.py runserver` on 127.0.0.1.

Each server binds a free loopback port, is waited for with a deadline and is killed (its whole
process group) when the block ends, also when the test fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).with_name("gunicorn")


def agent_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """eventservice.settings on SQLite in data_dir, the test run's SECRET_KEY, quiet logs."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "PYTEST", "SECURE_", "SESSION_", "CSRF_"))
        and key not in ("DATABASE_URL", "SECRET_KEY_FILE")
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "eventservice.settings",
            "DATA_DIR": str(data_dir),
            "DEBUG": "false",
            "LOG_LEVEL": "WARNING",
            "EVENT_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return on_its_database(env)


def on_its_database(env: dict[str, str]) -> dict[str, str]:
    """`env` without what only a PostgreSQL DATABASE_URL takes (the PgBouncer that scripts/test's
    PostgreSQL pass runs behind) when its DATABASE_URL is SQLite's."""
    if not env.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        env.pop("DATABASE_POOLER", None)
        env.pop("DATABASE_DIRECT_URL", None)
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def gunicorn(env: dict[str, str], *, workers: int = 1, threads: int = 4, timeout: float = 30) -> Iterator[int]:
    """Serve eventservice.wsgi on a free 127.0.0.1 port; yields the port once it accepts."""
    port = free_port()
    command = [
        str(GUNICORN),
        "eventservice.wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        "--log-level",
        "warning",
    ]
    with _serving(command, env, port=port, name="gunicorn", timeout=timeout):
        yield port


@contextmanager
def runserver(env: dict[str, str], *, timeout: float = 60) -> Iterator[int]:
    """`manage.py runserver` (without its reloader) on a free 127.0.0.1 port; yields the port
    once it accepts."""
    port = free_port()
    command = [sys.executable, str(ROOT / "manage.py"), "runserver", "--noreload", f"127.0.0.1:{port}"]
    with _serving(command, env, port=port, name="runserver", timeout=timeout):
        yield port


@contextmanager
def _serving(command: list[str], env: dict[str, str], *, port: int, name: str, timeout: float) -> Iterator[None]:
    log_path = Path(env["DATA_DIR"]) / f"{name}-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{name} not listening after {timeout}s: {log_path.read_text()[-2000:]}"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        # SIGINT is gunicorn's quick shutdown: requests still sleeping are not waited for.
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
