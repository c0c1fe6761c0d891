"""docs/commands.md stays true: its console sessions are replayed on a fresh database.

The page shows real sessions, "recorded on a fresh database with the web server and one
qcluster running". The replay runs every `$ ` line of its console blocks, in order, in a
directory of its own, against a fresh agent (gunicorn and one qcluster on a free loopback port,
AGENT_BASE_URL naming it, every other setting at its default), and compares each output and
`(exit N)` with the recorded one.

Only what differs from run to run is normalised: ids (UUIDs, the 8-digit short ids of tables),
API keys and their prefixes, secrets printed once, times, relative times, latencies, a
database's size, where the clone and a temporary directory are, curl's version, the port, and
the padding of table columns. A command naming a value shown earlier (a key's prefix, an id)
is run with the value the replay got in its place. A `list_*` command only reads, so it is run
again until its output matches, for a bounded time: the page shows what it lists once the
workers have run the calls.

To re-record a section, run its commands for real, after the page's earlier ones, on a fresh
database (`PORT=18751 scripts/start` in one shell; in another,
`export AGENT_BASE_URL=http://127.0.0.1:18751`) and paste each output followed by `(exit N)`.
"""

from __future__ import annotations

import difflib
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.agent_process import GUNICORN, free_port
from tests.support.waiting import wait_for
from workers.models import WorkerSession

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "commands.md"

CONSOLE = re.compile(r"^```console\n(.*?)^```", re.S | re.M)
EXIT = re.compile(r"\(exit (\d+)\)")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
READ = re.compile(r"python manage\.py list_\w+")
RECORDED_BASE_URL = re.compile(r"AGENT_BASE_URL=http://127\.0\.0\.1:(\d+)")
URL_HOST = re.compile(r"https?://(\[[^\]]*\]|[^/:\s'\"]+)")
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "[::1]"}
# How long a read may wait for the workers to reach the state the page shows, and all reads of
# a replay together (so a page that no longer matches fails in minutes, not hours).
READ_WAIT_SECONDS = 30.0
SESSION_WAIT_SECONDS = 120.0
COMMAND_TIMEOUT = 120.0

# Loaded by every Python process of the replay (it is first on PYTHONPATH): the page's examples
# name public hosts (example.com), and the agent must not reach them from a test, whatever a
# section submits or subscribes. Connections and name lookups beyond loopback are refused.
LOOPBACK_ONLY = """\
import ipaddress
import socket

_getaddrinfo = socket.getaddrinfo
_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _local(host):
    if host is None:
        return True
    host = (host.decode() if isinstance(host, bytes) else str(host)).split("%")[0].rstrip(".")
    if host.lower() in ("", "localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def getaddrinfo(host, *args, **kwargs):
    if not _local(host):
        raise socket.gaierror(socket.EAI_NONAME, f"the docs replay reaches loopback only, not {host}")
    return _getaddrinfo(host, *args, **kwargs)


def _check(address):
    if isinstance(address, tuple) and not _local(address[0]):
        raise ConnectionRefusedError(f"the docs replay reaches loopback only, not {address[0]}")


def connect(self, address):
    _check(address)
    return _connect(self, address)


def connect_ex(self, address):
    _check(address)
    return _connect_ex(self, address)


socket.getaddrinfo = getaddrinfo
socket.socket.connect = connect
socket.socket.connect_ex = connect_ex
"""


# ---- the page's sessions -------------------------------------------------------------------


@dataclass
class Step:
    command: str
    output: str
    exit: int | None  # None: a shell assignment (`DUE=$(date ...)`), which shows nothing
    line: int


def console_steps(text: str) -> list[Step]:
    """Every `$ ` command of the console blocks, in order, with its recorded output and exit."""
    steps: list[Step] = []
    for block in CONSOLE.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        lines = list(enumerate(block.group(1).splitlines(), start=first))
        i = 0
        while i < len(lines):
            number, line = lines[i]
            i += 1
            if not line.strip():
                continue
            if not line.startswith("$ "):
                raise ValueError(f"line {number}: a console block line outside a command's output: {line!r}")
            command = line[2:]
            while command.endswith("\\") and i < len(lines):
                command += "\n" + lines[i][1]
                i += 1
            output: list[str] = []
            while i < len(lines) and not lines[i][1].startswith("$ ") and not EXIT.fullmatch(lines[i][1]):
                output.append(lines[i][1])
                i += 1
            if i < len(lines) and (recorded := EXIT.fullmatch(lines[i][1])):
                steps.append(Step(command, "\n".join(output), int(recorded.group(1)), number))
                i += 1
            elif ASSIGNMENT.match(command) and not "".join(output).strip():
                steps.append(Step(command, "", None, number))
            else:
                raise ValueError(f"line {number}: `{command}` shows no (exit N) after its output")
    return steps


# ---- what differs from run to run ----------------------------------------------------------

_B64 = "A-Za-z0-9_-"
UNIT = r"(?:second|minute|hour|day|week|month|year)s?"
API_KEY = re.compile(rf"(?<![{_B64}])sa_[{_B64}]{{43}}(?![{_B64}])")
KEY_PREFIX = re.compile(rf"(?<![{_B64}])sa_[{_B64}]{{7}}(?![{_B64}])")  # a key's first 10 characters
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
TABLE_ID = re.compile(r"^[0-9a-f]{8}(?=  )", re.M)  # a table's ID column: an id's last 8 hex digits
# What a later command may name (`revoke_api_key acme sa_3zJ990O`): the replay runs it with the
# value it got where the page shows the value it got.
IDS = (API_KEY, KEY_PREFIX, UUID, TABLE_ID)
# Replaced in this order: a secret printed once may look like anything, a key like an id.
VARYING = [
    (re.compile(r"(not shown again\)?:\n)\S+"), r"\1<shown once>"),
    (re.compile(r"whsec_[A-Za-z0-9+/]{43}="), "<signing secret>"),
    (re.compile(r"^(  admin / )[A-Za-z0-9_-]{16}(?=\s)", re.M), r"\1<random password>"),  # seed_demo's
    (API_KEY, "<api key>"),
    (KEY_PREFIX, "<key prefix>"),
    (UUID, "<id>"),
    (TABLE_ID, "<id>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?"), "<time>"),
    (re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT"), "<time>"),
    (re.compile(rf"\b\d+\s{UNIT}(?:,\s\d+\s{UNIT})*\sago\b"), "<time ago>"),
    (re.compile(r"\b\d+ ms\b"), "<n> ms"),
    (re.compile(r'"latencyMs": \d+'), '"latencyMs": <n>'),
    (re.compile(r"\b\d{1,3}(?:,\d{3})* bytes\b"), "<n> bytes"),  # a database's size
    # Where the clone and a `mktemp -d` directory are.
    (re.compile(r"[^\s'\"]*/event_service\.db\b"), "<database file>"),
    (re.compile(r"[^\s'\"]*/tmp\.[A-Za-z0-9]{10}\b"), "<temporary directory>"),
    (re.compile(r"\bcurl/[\d.]+"), "curl/<version>"),
    # The policy's directives come in no fixed order from one process to the next.
    (
        re.compile(r'("Content-Security-Policy": ")([^"]*)"'),
        lambda m: m.group(1) + "; ".join(sorted(m.group(2).split("; "))) + '"',
    ),
    # Table columns are as wide as their widest value (a latency): compare the cells, not the padding.
    (re.compile(r"(?<=\S) {2,}"), "  "),
    (re.compile(r" +$", re.M), ""),
]


def normalise(text: str, port: str) -> str:
    """The output with what differs from run to run replaced by placeholders."""
    text = re.sub(rf"(?<=127\.0\.0\.1:|localhost:){port}\b", "<port>", text)
    for pattern, replacement in VARYING:
        text = pattern.sub(replacement, text)
    return text


# ---- the replay ----------------------------------------------------------------------------


def recorded_port(text: str) -> str:
    match = RECORDED_BASE_URL.search(text)
    assert match, "docs/commands.md says which AGENT_BASE_URL its sessions were recorded with"
    return match.group(1)


def replay_env(workdir: Path, port: int) -> dict[str, str]:
    """A clone's shell after `export AGENT_BASE_URL=...`: the documented defaults otherwise, data
    in ./data, `python` the venv's, and output as a terminal shows it (stdout and stderr in
    the order written, 80 columns)."""
    guard = workdir / ".loopback-only"
    guard.mkdir(parents=True, exist_ok=True)
    (guard / "sitecustomize.py").write_text(LOOPBACK_ONLY)
    (workdir / "data").mkdir(exist_ok=True)
    (workdir / "tmp").mkdir(exist_ok=True)
    if not (workdir / "manage.py").exists():
        (workdir / "manage.py").symlink_to(ROOT / "manage.py")
    env = {key: os.environ[key] for key in ("HOME", "LANG", "LC_ALL", "SECRET_KEY") if key in os.environ}
    env.update(
        {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PYTHONPATH": f"{guard}{os.pathsep}{ROOT}",
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "80",
            "DATA_DIR": str(workdir / "data"),
            "TMPDIR": str(workdir / "tmp"),
            "AGENT_BASE_URL": f"http://127.0.0.1:{port}",
        }
    )
    return env


def reaches_beyond_loopback(command: str) -> bool:
    """A command the replay runs outside its guarded Python processes (curl, ...) must name
    loopback URLs only."""
    if command.startswith("python manage.py "):
        return False
    return any(host.lower() not in LOOPBACK_NAMES for host in URL_HOST.findall(command))


@dataclass
class Replay:
    workdir: Path
    env: dict[str, str]
    recorded_port: str
    port: str
    read_wait: float = READ_WAIT_SECONDS
    wait_left: float = SESSION_WAIT_SECONDS
    variables: dict[str, str] = field(default_factory=dict)
    # A value the page shows -> the value the replay got in its place.
    got_for: dict[str, str] = field(default_factory=dict)
    # The output and exit of each step (by its line), as run: what a re-recording pastes.
    outputs: dict[int, tuple[str, int]] = field(default_factory=dict)

    def shell(self, command: str) -> tuple[str, int]:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=self.workdir,
            env={**self.env, **self.variables},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        return done.stdout, done.returncode

    def run(self, steps: list[Step]) -> list[str]:
        """Every step in order; returns one report per step whose output or exit differs."""
        problems = []
        for step in steps:
            where = f"docs/commands.md:{step.line}: $ {step.command}"
            command = re.sub(rf"(?<=127\.0\.0\.1:|localhost:){self.recorded_port}\b", self.port, step.command)
            for shown in sorted(self.got_for, key=len, reverse=True):
                command = command.replace(shown, self.got_for[shown])
            if reaches_beyond_loopback(command):
                problems.append(f"{where}\n  not replayed: it names a host beyond this machine")
                continue
            if step.exit is None:
                name = ASSIGNMENT.match(command).group(1)
                value, code = self.shell(f'{command}\nprintf %s "${name}"')
                if code != 0:
                    problems.append(f"{where}\n  the assignment failed (exit {code}): {value}")
                self.variables[name] = value
                continue
            expected = normalise(step.output, self.recorded_port)
            started, read = time.monotonic(), READ.match(command) is not None
            wait_until = started + (min(self.read_wait, self.wait_left) if read else 0)
            while True:
                output, code = self.shell(command)
                got = normalise(output.rstrip("\n"), self.port)
                if (got, code) == (expected, step.exit) or time.monotonic() >= wait_until:
                    break
                time.sleep(0.5)
            if read:
                self.wait_left = max(0.0, self.wait_left - (time.monotonic() - started))
            self._learn(step.output, output)
            self.outputs[step.line] = (output, code)
            if (got, code) != (expected, step.exit):
                diff = "".join(
                    difflib.unified_diff(
                        (expected + "\n").splitlines(True),
                        (got + "\n").splitlines(True),
                        "recorded (normalised)",
                        "replayed (normalised)",
                    )
                )
                problems.append(
                    f"{where}\n  (exit {step.exit}) recorded, (exit {code}) replayed\n{diff}"
                    f"  replayed output, to re-record:\n{output}"
                )
        return problems

    def _learn(self, shown: str, got: str) -> None:
        for pattern in IDS:
            shown_values, got_values = pattern.findall(shown), pattern.findall(got)
            if len(shown_values) == len(got_values):
                for value, replayed in zip(shown_values, got_values, strict=True):
                    self.got_for.setdefault(value, replayed)


def migrate(env: dict[str, str], workdir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _stop(proc: subprocess.Popen, *, group_signal: int | None = None, main_signal: int | None = None) -> None:
    if proc.poll() is None:
        if group_signal is not None:
            os.killpg(proc.pid, group_signal)
        else:
            proc.send_signal(main_signal)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    # Whatever the process left behind in its own group (a worker that outlived it).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _started(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _alive(proc: subprocess.Popen, log_path: Path) -> None:
    if proc.poll() is not None:
        raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")


@contextmanager
def web_server(env: dict[str, str], port: int, workdir: Path) -> Iterator[None]:
    """gunicorn as scripts/start runs it, on the port AGENT_BASE_URL names."""
    log_path = workdir / "gunicorn.log"
    # Something else answering there would pass for this server.
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is taken"
    args = [str(GUNICORN), "eventservice.wsgi:application", "--bind", f"127.0.0.1:{port}"]
    proc = _started([*args, "--workers", "2", "--threads", "8", "--log-level", "warning"], env, log_path)
    try:

        def accepts() -> bool:
            _alive(proc, log_path)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            except OSError:
                return False
            return True

        wait_for(accepts, timeout=30)
        yield
    finally:
        _stop(proc, group_signal=signal.SIGINT)  # gunicorn's quick shutdown


@contextmanager
def qcluster(env: dict[str, str], workdir: Path) -> Iterator[None]:
    """One `manage.py qcluster`, ready once one of its worker sessions beats."""
    log_path = workdir / "qcluster.log"
    proc = _started([sys.executable, str(ROOT / "manage.py"), "qcluster"], env, log_path)
    database = workdir / "data" / "event_service.db"
    try:

        def beating() -> bool:
            _alive(proc, log_path)
            with closing(sqlite3.connect(database, timeout=5)) as db:
                query = "SELECT 1 FROM worker_sessions WHERE status = ?"
                return db.execute(query, (WorkerSession.Status.RUNNING,)).fetchone() is not None

        wait_for(beating, timeout=60, interval=0.2)
        yield
    finally:
        _stop(proc, main_signal=signal.SIGTERM)  # django-q2 then stops its workers itself


def port_like(recorded: str) -> int:
    """A free port as long as the recorded one: the Host header echoed by the mock is counted
    in recorded Content-Length values."""
    for _ in range(100):
        port = free_port()
        if len(str(port)) == len(recorded):
            return port
    raise RuntimeError(f"no free {len(recorded)}-digit port")


# ---- the tests -----------------------------------------------------------------------------


def test_every_command_of_the_page_is_a_step_with_its_exit():
    text = DOC.read_text()
    steps = console_steps(text)
    prompts = [line for block in CONSOLE.finditer(text) for line in block.group(1).splitlines() if line[:2] == "$ "]
    assert len(steps) == len(prompts)
    shown = {step.command.split()[2] for step in steps if step.command.startswith("python manage.py ")}
    assert {"create_tenant", "create_api_key", "submit_call", "list_calls", "seed_demo"} <= shown
    assert all(step.exit is not None or ASSIGNMENT.match(step.command) for step in steps)
    assert recorded_port(text)


@pytest.mark.workers
def test_the_pages_sessions_replay_as_recorded(tmp_path):
    text = DOC.read_text()
    steps = console_steps(text)
    recorded = recorded_port(text)
    port = port_like(recorded)
    env = replay_env(tmp_path, port)
    migrate(env, tmp_path)
    with web_server(env, port, tmp_path), qcluster(env, tmp_path):
        problems = Replay(tmp_path, env, recorded, str(port)).run(steps)
    assert not problems, f"{len(problems)} recorded outputs differ (re-record them):\n\n" + "\n\n".join(problems)


def test_the_parser_reads_outputs_exits_assignments_and_continuations():
    text = (
        "Intro.\n\n```console\n"
        "$ python manage.py one\n"
        "first line\n\n"
        "after a blank line\n"
        "(exit 0)\n\n"
        "$ DUE=$(date -u -d '+1 day' +%F)\n"
        '$ python manage.py two --due "$DUE" \\\n'
        "    --tag x\n"
        "(exit 2)\n"
        "```\n\n```bash\n$ not a console block\n```\n"
    )
    assert console_steps(text) == [
        Step("python manage.py one", "first line\n\nafter a blank line", 0, 4),
        Step("DUE=$(date -u -d '+1 day' +%F)", "", None, 10),
        Step('python manage.py two --due "$DUE" \\\n    --tag x', "", 2, 11),
    ]
    with pytest.raises(ValueError, match="shows no"):
        console_steps("```console\n$ python manage.py three\nsome output\n```\n")


def test_what_varies_between_runs_is_normalised_and_nothing_else():
    key = "sa_vFccrCwjITeNVIZXJ85ydaY7uz3P2HaCs2PIhQAVg74"
    assert normalise(
        f"Created API key {key[:10]}… for tenant acme.\n{key}\n"
        "  admin / 5x_VrdJx2i13AdUj   superuser\n"
        "01a2011c-a9f7-74aa-9da6-e2cf32fe413d\n"
        "bb3defe7  Month end  Scheduled   2026-11-22 02:36:31Z  due 2026-12-22T02:36:30.123Z   200 in 27 ms\n"
        '"Date": "Sun, 22 Nov 2026 02:36:25 GMT", "latencyMs": 27, "User-Agent": "curl/7.88.1"\n'
        "last used 3\xa0minutes ago at http://127.0.0.1:18751/mock/ (not :187510)   \n"
        "Password (store it now; it is not shown again):\nJ4vT3rQnAeJ2xVw5Jwgc7TWF\n"
        "Backed up /home/me/agent/data/event_service.db to /tmp/tmp.zd3NqatoYv/a.db (647,168 bytes).\n"
        "\"Content-Security-Policy\": \"script-src 'self'; default-src 'self'\"",
        "18751",
    ) == (
        "Created API key <key prefix>… for tenant acme.\n<api key>\n"
        "  admin / <random password>  superuser\n"
        "<id>\n"
        "<id>  Month end  Scheduled  <time>  due <time>  200 in <n> ms\n"
        '"Date": "<time>", "latencyMs": <n>, "User-Agent": "curl/<version>"\n'
        "last used <time ago> at http://127.0.0.1:<port>/mock/ (not :187510)\n"
        "Password (store it now; it is not shown again):\n<shown once>\n"
        "Backed up <database file> to <temporary directory>/a.db (<n> bytes).\n"
        "\"Content-Security-Policy\": \"default-src 'self'; script-src 'self'\""
    )
    # What a command decides is compared as it is: a status, a count, a name, an exit.
    assert normalise("2 calls\nHttpError 404  Failed  bb3defe7", "18751") == "2 calls\nHttpError 404  Failed  bb3defe7"


def test_the_replay_catches_a_recorded_output_that_no_longer_matches(tmp_path):
    """A doctored block, replayed for real on a fresh database (these commands need no server)."""
    env = replay_env(tmp_path, 18751)
    migrate(env, tmp_path)
    true_block = (
        "```console\n"
        "$ python manage.py create_tenant acme --name 'Acme Inc.'\n"
        "Created tenant acme (Acme Inc.).\n(exit 0)\n\n"
        "$ python manage.py create_tenant acme\n"
        "CommandError: Invalid input:\n  slug: Tenant 'acme' already exists.\n(exit 1)\n"
        "```\n"
    )
    replay = Replay(tmp_path, env, "18751", "18751")
    assert replay.run(console_steps(true_block)) == []

    doctored = true_block.replace("acme", "globex").replace("(Acme Inc.)", "(Globex Corp.)")
    doctored = doctored.replace("(exit 1)", "(exit 0)")
    problems = replay.run(console_steps(doctored))
    assert len(problems) == 2
    assert problems[0].startswith("docs/commands.md:2: $ python manage.py create_tenant globex --name 'Acme Inc.'")
    assert "-Created tenant globex (Globex Corp.).\n+Created tenant globex (Acme Inc.).\n" in problems[0]
    assert "(exit 0) recorded, (exit 1) replayed" in problems[1]


def test_a_command_naming_a_value_shown_earlier_gets_the_value_the_replay_got(tmp_path):
    replay = Replay(tmp_path, replay_env(tmp_path, 18751), "18751", "18751")
    shown = "01a2011c-a9f7-74aa-9da6-e2cf32fe413d"
    block = (
        f"```console\n$ echo 01a20867-9dfd-7c96-a281-f7b2ed5f5d93 sa_3zJ990O\n{shown} sa_vFccrCw\n(exit 0)\n\n"
        # True only when run with the values the first command printed.
        f"$ [ {shown} = 01a20867-9dfd-7c96-a281-f7b2ed5f5d93 ] && [ sa_vFccrCw = sa_3zJ990O ]\n(exit 0)\n```\n"
    )
    assert replay.run(console_steps(block)) == []
    assert replay.got_for == {shown: "01a20867-9dfd-7c96-a281-f7b2ed5f5d93", "sa_vFccrCw": "sa_3zJ990O"}


def test_the_replay_runs_nothing_that_reaches_beyond_this_machine(tmp_path):
    replay = Replay(tmp_path, {}, "18751", "18751")
    problems = replay.run(console_steps("```console\n$ curl -s https://example.com/\n(exit 0)\n```\n"))
    assert problems == [
        "docs/commands.md:2: $ curl -s https://example.com/\n  not replayed: it names a host beyond this machine"
    ]
    assert not reaches_beyond_loopback("curl -s 'http://127.0.0.1:18751/mock/echo' -H 'Host: x'")
    assert not reaches_beyond_loopback("python manage.py submit_call --url http://example.com")  # guarded

    # The replay's Python processes (manage.py, gunicorn, qcluster) refuse to look up or connect
    # beyond loopback, before anything is sent.
    probe = (
        "import socket\n"
        "for attempt in (lambda: socket.getaddrinfo('example.com', 80),\n"
        "                lambda: socket.socket().connect(('192.0.2.1', 80))):\n"
        "    try:\n"
        "        attempt()\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__, exc)\n"
        "print(socket.getaddrinfo('localhost', 80)[0][4][0] in ('127.0.0.1', '::1'))\n"
    )
    env = replay_env(tmp_path, 18751)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == [
        "gaierror [Errno -2] the docs replay reaches loopback only, not example.com",
        "ConnectionRefusedError the docs replay reaches loopback only, not 192.0.2.1",
        "True",
    ]
