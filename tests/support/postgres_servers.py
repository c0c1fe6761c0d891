"""PostgreSQL servers of a test's own, for the tests that lose one (docs/deploy.md, "High
availability"): a primary and a standby streaming from it, each on a free 127.0.0.1 port, made
with Debian's `initdb` and `pg_basebackup` and run as the `postgres` user, never the shared server.

`kill` is the loss of the machine: SIGKILL to the postmaster and every process it started, so
no backend finishes what it was doing and nothing is flushed on the way out. Everything the
servers wrote goes when the block ends.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests.support.agent_process import free_port

BINARIES = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda path: int(path.split("/")[-2]))
START_SECONDS = 30


def unavailable_reason() -> str | None:
    """Why this machine cannot run such servers, or None."""
    if not BINARIES:
        return "needs PostgreSQL's server binaries (Debian's postgresql package: /usr/lib/postgresql/*/bin)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "needs the postgres user to run PostgreSQL servers as"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        return "needs root (to start PostgreSQL servers as the postgres user) or the postgres user"
    return None


def _as_postgres(*command: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


class Server:
    """One PostgreSQL server: its data directory under `base`, its port, its process."""

    def __init__(self, base: Path, name: str) -> None:
        self.name = name
        self.data = base / name
        self.port = free_port()
        self.log = base / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname} connect_timeout=3"

    def execute(self, sql: str, dbname: str = "postgres") -> list[tuple]:
        with psycopg.connect(self.conninfo(dbname), autocommit=True) as conn:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description else []

    def initdb(self, **settings: str) -> Server:
        _run(
            BINARIES[-1] + "/initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"
        )
        self.configure(**settings)
        return self

    def base_backup_of(self, primary: Server) -> Server:
        """A standby of `primary`: its files as of now, and it streams the rest (-R)."""
        _run(
            BINARIES[-1] + "/pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"),
            *("-D", str(self.data), "-R", "-X", "stream", "--no-sync", "--checkpoint=fast"),
        )
        return self

    def configure(self, **settings: str) -> None:
        lines = "".join(f"{name} = '{value}'\n" for name, value in settings.items())
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(lines)

    def start(self) -> Server:
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            _as_postgres(
                BINARIES[-1] + "/postgres",
                *("-D", str(self.data), "-p", str(self.port)),
                *("-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.data}"),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                self.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not start:\n{self.log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    @contextmanager
    def holding_back_wal(self) -> Iterator[None]:
        """A primary that sends its standbys nothing for the block's length (its WAL senders
        stopped, as on a slow or broken link): what it commits meanwhile is on no standby."""
        pids = [row[0] for row in self.execute("SELECT pid FROM pg_stat_replication")]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def promote(self) -> None:
        """A standby takes writes from now on (`pg_ctl promote`, as SQL)."""
        self.execute("SELECT pg_promote(true, 30)")

    def kill(self) -> None:
        """SIGKILL to the postmaster and to every process it started, at once."""
        if self.proc is None or self.proc.poll() is not None:
            return
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        for pid in [*_children(postmaster), postmaster]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


def _children(parent: int) -> list[int]:
    children = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.split("/")[2]))
    return children


def _wait_streaming(primary: Server) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not primary.execute("SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'"):
        if time.monotonic() > deadline:
            raise RuntimeError("the standby did not stream from the primary")
        time.sleep(0.05)


def _run(*command: str) -> None:
    result = subprocess.run(_as_postgres(*command), capture_output=True, text=True, timeout=120, check=False)
    if result.returncode:
        raise RuntimeError(f"{Path(command[0]).name} failed:\n{result.stdout}{result.stderr}")


@contextmanager
def primary_and_standby(*, synchronous: bool) -> Iterator[tuple[Server, Server]]:
    """A primary and a standby streaming from it, both started; with `synchronous`, a commit
    returns once the standby has its WAL (`synchronous_standby_names`)."""
    base = Path(tempfile.mkdtemp(prefix="sa-pg-"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    servers: list[Server] = []
    try:
        primary = Server(base, "primary").initdb(
            wal_level="replica",
            max_wal_senders="4",
            synchronous_standby_names="*" if synchronous else "",
            # What the test measures is the agent, not the disk: WAL is not forced to it (a
            # killed server's writes are in the kernel's cache all the same).
            fsync="off",
            max_connections="200",
        )
        servers.append(primary.start())
        standby = Server(base, "standby").base_backup_of(primary)
        # Its own settings are the primary's copy: once promoted it has no standby to wait for.
        standby.configure(synchronous_standby_names="")
        servers.append(standby.start())
        _wait_streaming(primary)
        yield primary, standby
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)
