"""What every benchmark shares: the environment, child processes, statistics."""

from __future__ import annotations

import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
_RUN_SECRET_KEY = secrets.token_urlsafe(50)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
# Optional: the event delivery rows' NATS part runs when a NATS server with JetStream answers here.
NATS_URL = os.environ.get("BENCH_NATS_URL", "nats://127.0.0.1:4222")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def agent_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of every process of the run: one temp DATA_DIR, SQLite, quiet logs."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST"))}
    env.pop("DATABASE_URL", None)
    env.update(
        {
            # Production settings whatever the caller's shell says: DEBUG keeps every query in
            # memory and wraps every cursor, which would be measured too.
            "DEBUG": "false",
            "DJANGO_SETTINGS_MODULE": "eventservice.settings",
            "DATA_DIR": str(data_dir),
            "EGRESS_ALLOWLIST": "127.0.0.0/8",
            "EVENT_LOG_LEVEL": "WARNING",
            "LOG_LEVEL": "WARNING",
            "Q_WORKERS": "2",
            # The bench measures how fast the agent takes submissions, not its per-key ceiling (50 a
            # second by default, docs/flow-control.md; its own tests show it): above the load client.
            "CEILING_SUBMISSIONS_PER_SECOND": "100000",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
    )
    # Outside DEBUG the agent refuses to start without a key; every process of one run shares it.
    env.setdefault("SECRET_KEY", _RUN_SECRET_KEY)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, *, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.1) -> Any:
    """Poll until predicate() is truthy; returns its value, or None on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


@dataclass
class Children:
    """Every process the run starts, each in its own process group; all stopped on exit."""

    log_dir: Path
    running: list[Child] = field(default_factory=list)

    def start(self, name: str, args: Sequence[str], *, env: dict[str, str], stdout_pipe: bool = False) -> Child:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                list(args),
                cwd=ROOT,
                env=env,
                start_new_session=True,
                stdout=subprocess.PIPE if stdout_pipe else log_file,
                stderr=log_file if stdout_pipe else subprocess.STDOUT,
                text=stdout_pipe or None,
            )
        child = Child(name, proc, log_path)
        self.running.append(child)
        return child

    def stop(self, child: Child, *, timeout: float = 20.0) -> None:
        """SIGTERM to the main process (it stops its own workers), then SIGKILL the group."""
        proc = child.proc
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log(f"{child.name} did not stop within {timeout}s; killing its process group")
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers of its own group only
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if child in self.running:
            self.running.remove(child)

    def stop_all(self) -> None:
        for child in reversed(list(self.running)):
            self.stop(child, timeout=10)


def _pids(match: Callable[[Path], bool]) -> list[int]:
    """The live processes of this machine (Linux /proc) whose /proc entry `match`es; one that
    goes away while it is looked at is left out."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if match(entry):
                    pids.append(int(entry.name))
            except OSError:  # ProcessLookupError and PermissionError among them
                continue
    return pids


def group_pids(pgid: int) -> list[int]:
    """Live processes of one process group (a child we started with its own session)."""
    return _pids(lambda entry: os.getpgid(int(entry.name)) == pgid)


def pid_holding(pgid: int, path_prefix: str) -> int | None:
    """The process of a group that holds a file whose path starts with path_prefix open."""
    for pid in group_pids(pgid):
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    if os.readlink(fd).startswith(path_prefix):
                        return pid
                except OSError:
                    continue
        except OSError:
            continue
    return None


def pids_named(name: str) -> list[int]:
    """The processes of this machine whose command name is `name`."""
    return _pids(lambda entry: (entry / "comm").read_text().strip() == name)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time used so far by these processes (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


class Profiler:
    """py-spy attached to one process for one phase (only with --py-spy; never required)."""

    def __init__(self, pid: int, out: Path, *, seconds: float, executable: str = "py-spy") -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [
                executable,
                "record",
                "--pid",
                str(pid),
                "--output",
                str(out),
                "--format",
                "raw",
                "--threads",
                "--gil",
                "--rate",
                "200",
                "--duration",
                str(int(seconds)),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


# --- statistics -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (q in 0..100)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds of a list of durations in seconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "p99": percentile(ms, 99),
        "max": max(ms) if ms else math.nan,
        "min": min(ms) if ms else math.nan,
    }
