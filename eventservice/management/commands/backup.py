"""manage.py backup <path> [--force]: a consistent copy of the SQLite database, while the agent runs."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

PG_DUMP_HINT = (
    'use pg_dump: pg_dump -Fc -f service-agent.dump "$DATABASE_URL" (restore with pg_restore; '
    "docs/deploy.md, Backup and restore)"
)


def _regexp(pattern: str | None, value: object) -> bool | None:
    # django.db.backends.sqlite3's REGEXP: NULL for NULL, else re.search.
    if pattern is None or value is None:
        return None
    return re.search(pattern, str(value)) is not None


def sqlite_backup(source: Path, target: Path) -> int:
    """Copy the database at `source` to `target` through SQLite's online backup API; returns the
    copy's size in bytes.

    A copy of the file alone misses whatever is still in the write-ahead log (`-wal`), and one
    taken while a transaction commits can be torn. The backup reads the database as one read
    transaction: the committed state at one instant, WAL included, while writers go on (in WAL
    mode a reader blocks no writer). The copy is written beside `target` and renamed over it
    only once SQLite's integrity check passed, so `target` is never a half-written file.
    """
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)  # mode 0600: the copy holds password hashes and sealed secrets
    partial = Path(name)
    try:
        # mode=rw: never create a database that is not there.
        source_db = sqlite3.connect(f"{source.as_uri()}?mode=rw", uri=True, timeout=30)
        try:
            copy_db = sqlite3.connect(partial)
            try:
                source_db.backup(copy_db)  # all pages in one step: one consistent snapshot
                # One self-contained file (no -wal beside it); the agent turns WAL on again when
                # it opens a restored copy (settings: init_command).
                copy_db.execute("PRAGMA journal_mode=DELETE")
                # The check evaluates CHECK constraints, and the tenants table's uses REGEXP, a
                # function Django's backend gives its connections (the same one here).
                copy_db.create_function("REGEXP", 2, _regexp, deterministic=True)
                problems = [row[0] for row in copy_db.execute("PRAGMA integrity_check")]
            finally:
                copy_db.close()
        finally:
            source_db.close()
        if problems != ["ok"]:
            raise CommandError(f"The copy failed SQLite's integrity check: {'; '.join(problems[:5])}")
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power cut
        finally:
            os.close(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return target.stat().st_size


class Command(BaseCommand):
    help = (
        "Write a consistent copy of the SQLite database to PATH while the agent runs (web and "
        "workers may go on writing): SQLite's online backup API reads the committed state at one "
        "instant, write-ahead log included, which copying the file does not. The copy is written "
        "to a temporary file beside PATH, checked with PRAGMA integrity_check and then renamed "
        "to PATH (mode 600: it holds password hashes and sealed secrets). An existing PATH is "
        "replaced only with --force. It prints the paths and the copy's size; with -v 0 nothing "
        "unless it fails (for cron). On PostgreSQL it refuses: use pg_dump -Fc. Restoring is "
        "described in docs/deploy.md."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "path", help="The file to write, for example /var/backups/service-agent/2026-11-22.sqlite3."
        )
        parser.add_argument("--force", action="store_true", help="Replace PATH if it exists.")

    def handle(self, *args: Any, path: str, force: bool, **options: Any) -> None:
        if connection.vendor != "sqlite":
            raise CommandError(
                f"This database is {connection.display_name}: backup copies SQLite only; {PG_DUMP_HINT}."
            )
        name = str(connection.settings_dict["NAME"])
        if name == ":memory:" or "mode=memory" in name:
            raise CommandError("The database is in memory: there is no file to back up.")
        source = Path(name).absolute()
        if not source.is_file():
            raise CommandError(f"The database file {source} does not exist (run manage.py migrate first).")
        target = Path(path).expanduser().absolute()
        # Refusals name the path as it was given; the report of a copy names it in full.
        if target.resolve() in {source.resolve(), *(Path(f"{source.resolve()}{end}") for end in ("-wal", "-shm"))}:
            raise CommandError(f"{path} is the database itself; give another path.")
        if not target.parent.is_dir():
            raise CommandError(f"The directory {Path(path).parent} does not exist.")
        if target.is_dir():
            raise CommandError(f"{path} is a directory; give a file name.")
        if target.exists() and not force:
            raise CommandError(f"{path} exists; pass --force to replace it.")
        size = sqlite_backup(source, target)
        if options["verbosity"] == 0:  # -v 0: silent on success, for cron (which mails any output)
            return
        self.stdout.write(f"Backed up {source} to {target} ({size:,} bytes; integrity check ok).")
