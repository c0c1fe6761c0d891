"""manage.py backup <path> [--force]: a consistent copy of the SQLite database while it is written."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, connections

from orchestration.models import ServiceCall
from tests.commands.cli import call, run_manage
from tests.support.factories import HOUR, make_call, make_tenant
from tests.support.sqlite_files import copy_elsewhere

sqlite_only = pytest.mark.skipif(
    "sqlite" not in connection.settings_dict["ENGINE"], reason="backup copies SQLite databases"
)


def _names(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT name FROM service_calls ORDER BY service_call_id")]


def _database() -> Path:
    connection.ensure_connection()
    return Path(connection.settings_dict["NAME"])


def _leftovers(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name.endswith(".part"))


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_the_copy_holds_the_last_committed_call_still_in_the_wal_and_nothing_uncommitted(tmp_path):
    make_tenant("acme")
    database = _database()
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the file holds everything so far
        cursor.execute("PRAGMA wal_autocheckpoint=0")
    # A reader that started before the writes: no checkpoint can move them into the file.
    reader = sqlite3.connect(database, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM service_calls").fetchall()
    writer = sqlite3.connect(database, isolation_level=None)
    try:
        calls = [make_call("acme", name=f"wal-{n}", due_in=HOUR) for n in range(1, 4)]
        assert Path(f"{database}-wal").stat().st_size > 0
        # Why not copy the file: the calls are in the WAL only.
        copy_elsewhere(database, tmp_path / "plain-copy.db")
        assert _names(tmp_path / "plain-copy.db") == []
        # A transaction in progress when the backup runs is not in it.
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE service_calls SET name = 'uncommitted' WHERE name = 'wal-3'")

        result = call("backup", str(tmp_path / "agent.sqlite3"))
    finally:
        writer.close()
        reader.close()
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_autocheckpoint=1000")

    assert result.code == 0, result.err
    size = (tmp_path / "agent.sqlite3").stat().st_size
    assert result.out == f"Backed up {database} to {tmp_path / 'agent.sqlite3'} ({size:,} bytes; integrity check ok).\n"
    assert _names(tmp_path / "agent.sqlite3") == ["wal-1", "wal-2", "wal-3"]
    with sqlite3.connect(tmp_path / "agent.sqlite3") as copy:
        last = copy.execute("SELECT service_call_id FROM service_calls ORDER BY service_call_id DESC LIMIT 1")
        assert last.fetchone()[0] == calls[-1].service_call_id.hex
        # One self-contained file: no write-ahead log to carry along.
        assert copy.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert not (tmp_path / "agent.sqlite3-wal").exists()
    assert (tmp_path / "agent.sqlite3").stat().st_mode & 0o777 == 0o600
    assert _leftovers(tmp_path) == []


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_copy_taken_while_calls_are_written_is_whole_and_consistent(tmp_path):
    make_tenant("acme")
    stop = threading.Event()
    written: list[str] = []

    def write() -> None:
        try:
            n = 0
            while not stop.is_set() and n < 2000:
                n += 1
                written.append(str(make_call("acme", name=f"busy-{n}", due_in=HOUR).service_call_id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(written) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        results = [call("backup", str(tmp_path / f"copy-{n}.sqlite3")) for n in range(3)]
    finally:
        stop.set()
        thread.join(timeout=60)
    assert all(result.code == 0 for result in results), [result.err for result in results]
    final = list(ServiceCall.objects.order_by("service_call_id").values_list("name", flat=True))
    counts = []
    for n in range(3):
        names = _names(tmp_path / f"copy-{n}.sqlite3")
        # Each copy is the committed state at one instant: the first calls, in order, none missing.
        assert names == final[: len(names)]
        with sqlite3.connect(tmp_path / f"copy-{n}.sqlite3") as copy:
            # Each call's timer and events are there with it (written in the call's transaction).
            timers = copy.execute("SELECT count(*) FROM timer_schedules").fetchone()[0]
            assert timers == len(names)
        counts.append(len(names))
    assert counts == sorted(counts) and counts[0] >= 20


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_it_refuses_to_overwrite_unless_forced(tmp_path):
    make_tenant("acme")
    target = tmp_path / "agent.sqlite3"
    target.write_text("an older backup")
    result = call("backup", str(target))
    assert result.code == 1
    assert result.err == f"{target} exists; pass --force to replace it."
    assert target.read_text() == "an older backup"

    make_call("acme", name="after", due_in=HOUR)
    result = call("backup", str(target), "--force")
    assert result.code == 0, result.err
    assert _names(target) == ["after"]
    assert _leftovers(tmp_path) == []


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_it_refuses_paths_it_cannot_or_must_not_write(tmp_path):
    database = _database()
    cases = {
        str(tmp_path / "missing" / "agent.sqlite3"): f"The directory {tmp_path / 'missing'} does not exist.",
        str(tmp_path): f"{tmp_path} is a directory; give a file name.",
        str(database): f"{database} is the database itself; give another path.",
        f"{database}-wal": f"{database}-wal is the database itself; give another path.",
    }
    for given, message in cases.items():
        result = call("backup", given, "--force")
        assert (result.code, result.err) == (1, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.django_db
def test_on_postgresql_it_refuses_and_names_pg_dump(tmp_path, monkeypatch):
    monkeypatch.setattr(connections["default"], "vendor", "postgresql")
    monkeypatch.setattr(connections["default"], "display_name", "PostgreSQL")
    result = call("backup", str(tmp_path / "agent.sqlite3"))
    assert result.code == 1
    assert result.err == (
        "This database is PostgreSQL: backup copies SQLite only; use pg_dump: pg_dump -Fc -f service-agent.dump "
        '"$DATABASE_URL" (restore with pg_restore; docs/deploy.md, Backup and restore).'
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.postgres
@pytest.mark.django_db
def test_on_a_real_postgresql_database_it_refuses(tmp_path):
    result = call("backup", str(tmp_path / "agent.sqlite3"))
    assert result.code == 1
    assert "pg_dump -Fc" in result.err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.django_db(transaction=True)
def test_help_explains_why_not_a_file_copy():
    result = run_manage("backup", "--help")
    assert result.code == 0
    for words in ("write-ahead log", "--force", "integrity_check", "pg_dump -Fc", "docs/deploy.md"):
        assert words in result.out.replace("\n", " ").replace("  ", " ")


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_quiet_it_prints_nothing_and_a_refusal_names_the_path_as_given(tmp_path, monkeypatch):
    make_tenant("acme")
    monkeypatch.chdir(tmp_path)
    result = call("backup", "agent.sqlite3", "-v", "0")
    assert (result.code, result.out, result.err) == (0, "", "")
    assert (tmp_path / "agent.sqlite3").is_file()
    result = call("backup", "agent.sqlite3")
    assert (result.code, result.err) == (1, "agent.sqlite3 exists; pass --force to replace it.")
