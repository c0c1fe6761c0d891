"""A PgBouncer of the tests' own, made from the shipped deploy/pgbouncer.ini (docs/deploy.md,
"Connections"): the same pooling (transaction mode, pool sizes, no reset query) on loopback,
routing any database name (the tests' test_... databases too) to one PostgreSQL server, with
trust authentication and its files in a directory of its own.

    python3 scripts/pgbouncer.py start DIR [--port N] [--upstream 127.0.0.1:5432] [--user postgres]
    python3 scripts/pgbouncer.py stop DIR

`start` prints the port it listens on once it accepts connections (a free one unless given);
.ci/run starts one for scripts/test's PostgreSQL pass. Run as root, PgBouncer (which refuses
root) runs as the PostgreSQL system user, which must reach DIR (a directory of its own under
/tmp does). Only the standard library: it runs before the virtualenv exists.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "deploy" / "pgbouncer.ini"
SETTING = re.compile(r"^(\s*)([a-z_]+)(\s*=\s*)(.*)$")


def pgbouncer_binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None


def loopback_config(shipped: str, *, port: int, upstream: tuple[str, int], directory: Path) -> str:
    """The shipped configuration on 127.0.0.1:`port`: every database name goes to `upstream`,
    authentication is trust (the users of DIR/userlist.txt), the files are in `directory`, and
    every pooling setting is the shipped one."""
    changes = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(directory / "userlist.txt"),
        "logfile": str(directory / "pgbouncer.log"),
        "pidfile": str(directory / "pgbouncer.pid"),
    }
    lines, section, routed = [], None, False
    for line in shipped.splitlines():
        header = re.fullmatch(r"\s*\[(\w+)\]\s*", line)
        if header:
            section = header.group(1)
        setting = SETTING.match(line)
        if setting and section == "databases":
            if not routed:  # the shipped database, and any other name, to the test server
                lines.append(f"* = host={upstream[0]} port={upstream[1]}")
                routed = True
            continue
        if setting and section == "pgbouncer" and setting.group(2) in changes:
            indent, key, equals, _ = setting.groups()
            line = f"{indent}{key}{equals}{changes.pop(key)}".rstrip()
        lines.append(line)
    missing = sorted(changes) + ([] if routed else ["a [databases] entry"])
    if missing:
        raise SystemExit(f"deploy/pgbouncer.ini has no {', '.join(missing)}: scripts/pgbouncer.py cannot use it")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def start(directory: Path, *, port: int | None, upstream: tuple[str, int], user: str) -> int:
    binary = pgbouncer_binary()
    if binary is None:
        raise SystemExit("pgbouncer is not installed (apt-get install pgbouncer)")
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    config = directory / "pgbouncer.ini"
    config.write_text(loopback_config(SHIPPED.read_text(), port=port, upstream=upstream, directory=directory))
    (directory / "userlist.txt").write_text(f'"{user}" ""\n')
    command = [binary, "-d", "-q", str(config)]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: the PostgreSQL system user owns its files.
        owner = pwd.getpwnam("postgres")
        for path in (directory, *directory.iterdir()):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        command[1:1] = ["-u", "postgres"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise SystemExit(f"pgbouncer did not start: {result.stderr.strip() or result.stdout.strip()}")
    deadline = time.monotonic() + 10
    while not accepts(port):
        if time.monotonic() > deadline:
            log = directory / "pgbouncer.log"
            raise SystemExit(f"pgbouncer not listening on {port}: {log.read_text()[-2000:] if log.exists() else ''}")
        time.sleep(0.05)
    return port


def stop(directory: Path) -> None:
    pidfile = directory / "pgbouncer.pid"
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text().strip())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--upstream", default="127.0.0.1:5432", help="host:port of PostgreSQL")
    parser.add_argument("--user", default="postgres", help="the user the tests connect as")
    args = parser.parse_args(argv)
    if args.action == "stop":
        stop(args.directory)
        return 0
    host, _, port = args.upstream.rpartition(":")
    print(start(args.directory, port=args.port, upstream=(host, int(port)), user=args.user))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
