"""Why tests read the live SQLite files through tests/support/sqlite_files.py: a plain read in
this process drops its connections' locks, and another process's last connection then deletes
the write-ahead log under them (the "database disk image is malformed" of an xdist worker)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.support.sqlite_files import copy_elsewhere, read_bytes_elsewhere

ANOTHER_PROCESS_WRITES = (
    "import sqlite3, sys\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "for _ in range(200):\n"
    "    db.execute('INSERT INTO t VALUES (randomblob(500))')\n"
    "db.close()\n"
)


def _after_a_read_and_another_writer(tmp_path: Path, read) -> tuple[str, int]:
    """This process writes (WAL kept), reads the file with `read`, another process writes and
    closes, twice; what this process's connection then finds, and the rows a new reader sees."""
    path = tmp_path / "live.db"
    mine = sqlite3.connect(path, isolation_level=None)
    try:
        mine.execute("PRAGMA journal_mode=WAL")
        mine.execute("PRAGMA wal_autocheckpoint=0")  # what is written stays in the -wal file
        mine.execute("CREATE TABLE t (x)")
        for _ in range(200):
            mine.execute("INSERT INTO t VALUES (randomblob(500))")
        read(path)
        for _ in range(2):  # the first one's last connection deletes the log; the second writes anew
            subprocess.run([sys.executable, "-c", ANOTHER_PROCESS_WRITES, str(path)], check=True, timeout=60)
        try:
            for _ in range(200):
                mine.execute("INSERT INTO t VALUES (randomblob(500))")
            found = str(mine.execute("PRAGMA integrity_check").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            found = str(exc)
    finally:
        mine.close()
    with sqlite3.connect(path) as fresh:
        return found, fresh.execute("SELECT count(*) FROM t").fetchone()[0]


def test_a_plain_read_in_this_process_costs_its_writes(tmp_path):
    assert _after_a_read_and_another_writer(tmp_path, Path.read_bytes) == ("database disk image is malformed", 600)


def test_reading_and_copying_from_another_process_keep_every_write(tmp_path):
    copies = []

    def read(path: Path) -> None:
        copies.append(read_bytes_elsewhere(path))
        copy_elsewhere(path, tmp_path / "copy.db")

    assert _after_a_read_and_another_writer(tmp_path, read) == ("ok", 800)
    assert copies[0].startswith(b"SQLite format 3\x00")
    assert (tmp_path / "copy.db").read_bytes()[:16] == b"SQLite format 3\x00"
