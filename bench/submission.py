"""Submission: POST /api/tenants/<t>/service-calls under gunicorn, from a local load client,
and the same POSTs to the floor (bench/floor.py) under the same gunicorn command line.

The web app runs as it would in production (gunicorn, 2 workers x 8 threads) on the bench's
database while the agent's workers run; calls are due in an hour, so the workers only publish
their Submitted/Scheduled events meanwhile. The floor's gunicorn differs only in its settings
module (bench.floor_settings: the project's, with the floor view in the URLconf).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.agent import ensure_tenant
from bench.common import PYTHON, ROOT, Child, Children, free_port, log, wait_port

SUBMIT_TENANT = "bench-submit"
# The product's collection path, and the floor view's (bench/floor.py).
API_PATH = f"/api/tenants/{SUBMIT_TENANT}/service-calls"
FLOOR_PATH = f"/bench/floor/tenants/{SUBMIT_TENANT}/service-calls"
FLOOR_SETTINGS = "bench.floor_settings"

WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[%(body)s]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(key)s"

done = function(summary, latency, requests)
  io.write(string.format(
    '{"requests":%%d,"duration_us":%%d,"p50_us":%%d,"p99_us":%%d,"max_us":%%d,' ..
    '"status_errors":%%d,"connect_errors":%%d,"read_errors":%%d,"write_errors":%%d,"timeouts":%%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    summary.errors.status, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.timeout))
end
"""


def start_web(
    children: Children, env: dict[str, str], *, name: str = "gunicorn", settings: str | None = None
) -> tuple[Child, int]:
    """gunicorn on the project's WSGI app; `settings` replaces DJANGO_SETTINGS_MODULE only."""
    port = free_port()
    if settings is not None:
        env = {**env, "DJANGO_SETTINGS_MODULE": settings}
    child = children.start(
        name,
        [
            PYTHON,
            "-m",
            "gunicorn",
            "eventservice.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--threads",
            "8",
            "--worker-class",
            "gthread",
            "--log-level",
            "warning",
        ],
        env=env,
    )
    wait_port(port, timeout=30, proc=child.proc)
    return child, port


def _worker_pids(master: int) -> list[int]:
    """gunicorn's worker processes: the children of its arbiter."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        if int(stat.rsplit(")", 1)[1].split()[1]) == master:
            pids.append(int(entry.name))
    return pids


def _established_inodes(port: int) -> set[str]:
    """The inodes of the established TCP connections whose local port is `port`."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def connections_per_worker(master: int, port: int) -> list[int]:
    """How many of the clients' connections each gunicorn worker holds now, most first."""
    inodes = _established_inodes(port)
    counts = []
    for pid in _worker_pids(master):
        held = 0
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(fd.path)
                except OSError:
                    continue
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    held += 1
        except OSError:
            continue
        counts.append(held)
    return sorted(counts, reverse=True)


@contextmanager
def split_watched(web: Child, port: int) -> Iterator[list[int]]:
    """The clients' connections per web worker while the block runs: the fullest sample (a
    load client keeps its connections for the whole run, and gunicorn never moves one from
    the worker that accepted it)."""
    split: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.25):
            sample = connections_per_worker(web.proc.pid, port)
            if sum(sample) >= sum(split):
                split[:] = sample

    thread = threading.Thread(target=watch, name="split-watch", daemon=True)
    thread.start()
    try:
        yield split
    finally:
        stop.set()
        thread.join(5)


def api_key() -> str:
    from tenants.services import api_key_create

    ensure_tenant(SUBMIT_TENANT)
    _, raw = api_key_create(tenant_id=SUBMIT_TENANT, label="bench")
    return raw


def python_client(
    *, port: int, key: str, target: str, total: int, threads: int, env: dict[str, str], path: str = API_PATH
) -> dict:
    url = f"http://127.0.0.1:{port}{path}"
    log(f"submission: {total} POSTs to {path} from the Python load client ({threads} threads)")
    done = subprocess.run(
        [
            PYTHON,
            str(ROOT / "bench" / "load_client.py"),
            "--url",
            url,
            "--key",
            key,
            "--target",
            target,
            "--total",
            str(total),
            "--threads",
            str(threads),
            "--max-seconds",
            "120",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"load client failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def wrk_client(
    *, port: int, key: str, target: str, seconds: int, connections: int, path: str = API_PATH
) -> dict | None:
    """The same POSTs from wrk (C, so the client takes less CPU from the server); None without wrk."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    due = (datetime.now(UTC) + timedelta(hours=1)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    body = json.dumps(
        {
            "name": "submit-wrk",
            "requestSpec": {"method": "POST", "url": target, "headers": {"X-Bench": "1"}, "body": {"n": 1}},
            "dueAt": due,
            "tags": ["bench", "submit"],
        }
    )
    url = f"http://127.0.0.1:{port}{path}"
    log(f"submission: wrk on {path} for {seconds}s ({connections} connections, 2 threads)")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(WRK_SCRIPT % {"body": body, "key": key})
        done = subprocess.run(
            [wrk, "-t", "2", "-c", str(connections), "-d", f"{seconds}s", "--timeout", "10s", "-s", str(script), url],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed:\n{done.stderr[-2000:]}")
    line = [row for row in done.stdout.splitlines() if row.startswith("{")][-1]
    raw = json.loads(line)
    errors = sum(raw[name] for name in ("status_errors", "connect_errors", "read_errors", "write_errors", "timeouts"))
    seconds_run = raw["duration_us"] / 1e6
    return {
        "client": f"wrk, {connections} connections",
        "requests": raw["requests"],
        "seconds": seconds_run,
        "rate": (raw["requests"] - errors) / seconds_run,
        "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
        "errors": errors,
    }


def accepted_rows() -> int:
    from orchestration.models import ServiceCall

    return ServiceCall.objects.filter(tenant_id=SUBMIT_TENANT).count()
