"""`scripts/start` as a newcomer runs it (README, "The two commands"), in a copy of this clone,
and Ctrl-C.

The copy shares this clone's `.venv` (the install step then has nothing to fetch: pip runs with
no index) and starts on a free 127.0.0.1 port with its own ./data/, on a terminal (a
pseudo-terminal): short text lines, no event lines, and the demo's logins last, after "Service
Agent is up". The JSON lines (its output going elsewhere) are tests/eventservice/test_logging.py's.
"""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.agent_process import ROOT, free_port

pytestmark = pytest.mark.workers

VENV = Path(sys.prefix)
# What a checkout holds (tracked or not), not what running it leaves behind.
LEFT_OUT = shutil.ignore_patterns(
    ".venv", ".git", "data", "staticfiles", "__pycache__", ".pytest_cache", ".ruff_cache", "test-artifacts", "results"
)
UP = "Service Agent is up"
DEMO_END = r"^Calls: .*demo-ops"  # the last line but one of seed_demo's report
# gunicorn's access log as scripts/start sets it: client, request line, status, bytes, duration.
ACCESS_LINE = re.compile(r'^\S+ "[A-Z]+ \S+ HTTP/1\.[01]" \d{3} (\d+|-) \d+ms$')
TEXT_LOG_LINE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ ")


@pytest.fixture
def clone(tmp_path) -> Path:
    if not (VENV / "pyvenv.cfg").is_file():
        pytest.skip("the tests do not run from a virtualenv that scripts/start could reuse")
    copy = tmp_path / "clone"
    shutil.copytree(ROOT, copy, ignore=LEFT_OUT, symlinks=True)
    (copy / ".venv").symlink_to(VENV)
    return copy


def _env(port: int) -> dict[str, str]:
    """A newcomer's shell: no setting of the agent's, only the port (and pip kept offline)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PORT": str(port),
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


class Started:
    """scripts/start in a session of its own, writing to a pseudo-terminal read as it comes."""

    def __init__(self, clone: Path) -> None:
        self.chunks: list[bytes] = []
        self.fd, terminal = pty.openpty()
        self.port = free_port()  # never the default 8000: the examples must follow it
        self.proc = subprocess.Popen(
            ["bash", str(clone / "scripts" / "start")],
            cwd=clone,
            env=_env(self.port),
            stdin=subprocess.DEVNULL,
            stdout=terminal,
            stderr=terminal,
            start_new_session=True,
        )
        os.close(terminal)

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace").replace("\r\n", "\n")

    def read(self, seconds: float) -> bool:
        """Read for up to `seconds`; False once the console is closed."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # a pseudo-terminal whose last writer is gone
                chunk = b""
            if not chunk:
                return False
            self.chunks.append(chunk)
        return True

    def read_until(self, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text, re.M):
            if time.monotonic() > deadline or not self.read(0.2) and not re.search(pattern, self.text, re.M):
                raise AssertionError(f"no {pattern!r} within {timeout}s; the console:\n{self.text[-6000:]}")

    def ctrl_c(self) -> None:
        """What Ctrl-C does: SIGINT to the terminal's foreground process group (the script's)."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            # Read the terminal meanwhile, as a terminal does: its buffer full, the servers' last
            # lines would block their writers, and so their stop.
            deadline = time.monotonic() + 120
            while self.proc.poll() is None and time.monotonic() < deadline and self.read(0.2):
                pass
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            self.read(0.5)
            os.close(self.fd)


def _session(sid: int) -> list[int]:
    """The processes of the session the test started (its servers run in groups of their own)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # the session id, after state, ppid and pgrp
            pids.append(int(stat.parent.name))
    return pids


def _kill_session(sid: int) -> None:
    for pid in _session(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def script(clone):
    script = Started(clone)
    yield script
    if script.proc.poll() is None:
        script.proc.kill()
    _kill_session(script.proc.pid)


def _logs(lines: list[str]) -> list[str]:
    """The servers' lines: neither scripts/start's own (`==>`, the banner) nor the demo's block."""
    return [line for line in lines if line and not line.startswith(("==>", " ")) and "://" not in line]


# serial: beside the parallel pass's qclusters and servers, the script's stop after Ctrl-C has
# taken over two minutes (alone, a few seconds); why is not found yet.
@pytest.mark.serial
def test_a_first_start_on_a_terminal_is_short_and_readable_and_ends_with_the_logins(clone, script):
    script.read_until(DEMO_END, timeout=240)
    script.read(1.0)  # what follows at once
    console = script.text
    before, banner, after = console.partition(UP)
    assert banner, console

    # The logins come after "up", and nothing but the slowest demo answer's access line after them.
    logins = after.splitlines()
    assert any(line.startswith("  demo / service-agent-demo") for line in logins), after
    assert any(re.match(r"  admin / \S+ +superuser", line) for line in logins), after
    key_line = logins.index("API key for tenant demo (shown once; store it now):")
    api_key = logins[key_line + 1].strip()
    assert api_key.startswith("sa_")
    first_calls_line = next(n for n, line in enumerate(logins) if line.startswith("Calls: "))
    tail = [line for line in logins[first_calls_line:] if line.strip()]
    assert len(tail) <= 5, tail  # Calls: demo, Calls: demo-ops, "They run when...", a straggler

    # Short: every server line is one readable line; events are not logged; no JSON anywhere.
    lines = console.splitlines()
    assert len(lines) < 70, console
    logs = _logs(before.splitlines())
    assert logs, console
    for line in logs:
        assert TEXT_LOG_LINE.match(line) or ACCESS_LINE.match(line), line
        assert "{" not in line and len(line) < 300, line
    assert "serviceagent.events" not in console
    attempts = [line for line in logs if "attempt finished" in line]
    assert attempts, console
    for line in attempts:
        assert all(f" {key}=" in line for key in ("tenantId", "serviceCallId", "correlationId")), line

    # The secrets shown once are in no file under data/ but the database (where they are hashed).
    data = clone / "data"
    assert (data / "secret_key").stat().st_mode & 0o777 == 0o600
    for path in data.rglob("*"):
        if path.is_file() and ".db" not in path.name:
            assert api_key.encode() not in path.read_bytes(), path

    try_it_from_another_shell(clone, port=script.port, api_key=api_key)

    # Ctrl-C stops the script, the web server and the workers, each with one signal.
    script.ctrl_c()
    assert "==> stopping" in script.text
    assert _session(script.proc.pid) == []


def try_it_from_another_shell(clone: Path, *, port: int, api_key: str) -> None:
    """The README's "Try it" examples, as a newcomer pastes them into a second shell (no PORT,
    no AGENT_BASE_URL), having set the two lines they say to set: the port scripts/start serves
    and the printed key. Then a mock URL on the default port is refused at once, with the
    agent's address."""
    section = (ROOT / "README.md").read_text().split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 2, section
    shell = "set -euo pipefail\n" + "\n".join(blocks)
    assert re.search(r"^PORT=8000 ", shell, re.M) and "KEY=sa_..." in shell
    shell = re.sub(r"^PORT=8000 ", f"PORT={port} ", shell, flags=re.M).replace("KEY=sa_...", f"KEY={api_key}")
    env = {key: value for key, value in _env(port).items() if key != "PORT"}
    ran = subprocess.run(["bash", "-c", shell], cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert '"name":"hello"' in ran.stdout.replace(" ", ""), ran.stdout  # the POST's answer and the list
    # submit_call's id (curl's answers end without a newline: it follows the last one).
    assert re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", ran.stdout, re.M), ran.stdout
    submit = [".venv/bin/python", "manage.py", "submit_call", "--tenant=demo", "--name=ping", "--method=GET"]
    wrong = "--url=http://127.0.0.1:8000/mock/echo"
    refused = subprocess.run([*submit, wrong], cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"This agent's mock target is http://127.0.0.1:{port}/mock/" in refused.stderr, refused.stderr


def test_a_port_that_something_else_answers_on_is_refused_before_anything_starts(clone):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        result = subprocess.run(
            ["bash", str(clone / "scripts" / "start")],
            cwd=clone,
            env=_env(port),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    assert result.returncode == 1
    assert result.stderr == (
        f"==> something already answers on 127.0.0.1:{port}: stop it, or choose another port "
        "(PORT=8001 scripts/start)\n"
    )
    assert not (clone / "data").exists()  # nothing set up, nothing started
