"""The SQLite backend waits for the write lock in fine steps, within its timeout."""

import sqlite3
import threading
import time

import pytest
from django.db import OperationalError, connection, transaction

from tenants.models import Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def hold_write_lock(seconds: float) -> threading.Thread:
    held = threading.Event()

    def hold():
        other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(5)
    return thread


@pytest.fixture(autouse=True)
def sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite backend only")


def test_a_writer_waits_while_another_holds_the_lock_and_then_commits():
    holder = hold_write_lock(0.3)
    started = time.monotonic()
    with transaction.atomic():
        Tenant.objects.create(id="waited", name="w")
    waited = time.monotonic() - started
    holder.join()
    assert waited >= 0.2  # it did wait for the other writer, and did not fail
    assert Tenant.objects.filter(id="waited").exists()
    with connection.cursor() as cursor:  # SQLite's own busy timeout is back for plain statements
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] == int(connection.settings_dict["OPTIONS"]["timeout"] * 1000)


def test_a_writer_gives_up_with_database_is_locked_after_its_timeout(monkeypatch):
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.2)
    holder = hold_write_lock(1.0)
    with pytest.raises(OperationalError, match="locked"), transaction.atomic():
        Tenant.objects.create(id="never", name="n")
    holder.join()
    assert not Tenant.objects.filter(id="never").exists()


def _write_in_thread(tenant_id: str, started: threading.Event, done: list) -> threading.Thread:
    def write():
        started.set()
        try:
            with transaction.atomic():
                Tenant.objects.create(id=tenant_id, name="t")
            done.append(time.monotonic())
        except Exception as exc:  # noqa: BLE001 - reported to the test
            done.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=write)
    thread.start()
    return thread


@pytest.mark.serial  # the next writer starts within 0.1 s of the commit
def test_writers_of_one_process_take_turns_and_the_next_starts_when_the_first_commits():
    started, done = threading.Event(), []
    with transaction.atomic():
        Tenant.objects.create(id="first", name="f")
        other = _write_in_thread("second", started, done)
        started.wait(5)
        time.sleep(0.2)
        assert done == []  # waiting for this transaction, not failing
        committed = time.monotonic()
    other.join(5)
    assert len(done) == 1 and not isinstance(done[0], Exception)
    assert done[0] - committed < 0.1  # its turn came with the commit, not at a later poll
    assert set(Tenant.objects.filter(id__in=["first", "second"]).values_list("id", flat=True)) == {"first", "second"}


def test_a_transaction_that_fails_or_a_connection_closed_in_one_ends_its_turn():
    with pytest.raises(ValueError), transaction.atomic():
        Tenant.objects.create(id="rolled-back", name="r")
        raise ValueError("the change failed")
    started, done = threading.Event(), []
    _write_in_thread("after-rollback", started, done).join(5)
    assert len(done) == 1 and not isinstance(done[0], Exception)

    atomic = transaction.atomic()
    atomic.__enter__()
    Tenant.objects.create(id="closed", name="c")
    connection.close()
    atomic.__exit__(None, None, None)
    done.clear()
    _write_in_thread("after-close", started, done).join(5)
    assert len(done) == 1 and not isinstance(done[0], Exception)
    assert not Tenant.objects.filter(id__in=["rolled-back", "closed"]).exists()


def test_a_writer_waiting_for_another_thread_of_its_process_gives_up_after_its_timeout(monkeypatch):
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.2)
    started, done = threading.Event(), []
    with transaction.atomic():
        Tenant.objects.create(id="holder", name="h")
        other = _write_in_thread("too-late", started, done)
        other.join(5)
    assert len(done) == 1 and isinstance(done[0], OperationalError) and "locked" in str(done[0])
    assert not Tenant.objects.filter(id="too-late").exists()


# --- The processes' write turn (a flock beside the database) -----------------------------------
# Another process is played by a descriptor of this one: flocks of two open files conflict as
# those of two processes do.


def _paths():
    from eventservice.sqlite.base import _writer_paths

    return _writer_paths(connection.settings_dict["NAME"])


def _hold(path: str) -> int:
    import fcntl
    import os

    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_writer_waits_for_another_processs_turn_and_gives_up_after_its_timeout(monkeypatch):
    import os

    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.2)
    other = _hold(_paths()[0])
    try:
        with pytest.raises(OperationalError, match="locked"), transaction.atomic():
            Tenant.objects.create(id="never", name="n")
    finally:
        os.close(other)
    assert not Tenant.objects.filter(id="never").exists()
    with transaction.atomic():  # the turn it gave up on is not left held
        Tenant.objects.create(id="after", name="a")
    assert Tenant.objects.filter(id="after").exists()


def test_a_writer_starts_when_the_other_process_lets_its_turn_go():
    import os

    other = _hold(_paths()[0])
    threading.Timer(0.3, os.close, [other]).start()
    started = time.monotonic()
    with transaction.atomic():
        Tenant.objects.create(id="waited", name="w")
    assert time.monotonic() - started >= 0.2
    assert Tenant.objects.filter(id="waited").exists()


def test_an_urgent_writer_of_another_process_goes_before_the_writers_that_wait():
    """The timer's starts (core.db.urgent_writes): a writer that gets the turn while an urgent one
    waits gives it back, and takes it again once the urgent writer is done."""
    import os

    from eventservice.sqlite.base import _close, _take_turn

    paths = _paths()
    order: list[str] = []
    held: dict[str, list[int]] = {}

    def writer(name: str, urgent: bool) -> None:
        held[name] = _take_turn(paths, time.monotonic() + 10, urgent=urgent)
        order.append(name)

    holder = _hold(paths[0])
    normal = threading.Thread(target=writer, args=("normal", False), daemon=True)
    normal.start()
    time.sleep(0.1)
    urgent = threading.Thread(target=writer, args=("urgent", True), daemon=True)
    urgent.start()
    time.sleep(0.1)
    assert order == []  # both wait for the turn held
    os.close(holder)
    urgent.join(5)
    if order != ["urgent"]:  # let every waiter go, so a failure fails rather than hangs
        for fds in held.values():
            _close(fds)
    assert order == ["urgent"]
    time.sleep(0.2)
    assert order == ["urgent"]  # the other waits while the urgent writer holds the turn
    _close(held["urgent"])
    normal.join(5)
    assert order == ["urgent", "normal"]
    _close(held["normal"])


def test_an_urgent_writer_gives_up_at_its_deadline_and_lets_its_claim_go():
    import os

    from eventservice.sqlite.base import _close, _take_turn

    paths = _paths()
    holder = _hold(paths[0])
    try:
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            _take_turn(paths, time.monotonic() + 0.2, urgent=True)
        assert time.monotonic() - started < 5
    finally:
        os.close(holder)
    claim = _take_turn(paths, time.monotonic() + 1, urgent=True)  # nothing was left held
    _close(claim)


def test_a_forked_child_does_not_keep_its_parents_turn():
    """django-q2 forks its workers: a copied descriptor would hold the turn after the parent let
    it go, until the child exited."""
    import fcntl
    import os

    from eventservice.sqlite.base import _close, _flock

    fd = _flock(_paths()[0], fcntl.LOCK_EX, 1)
    child = os.fork()
    if child == 0:
        time.sleep(3)
        os._exit(0)
    try:
        _close([fd])
        other = os.open(_paths()[0], os.O_RDONLY)
        try:
            # Free while the child lives on (once it has run its after-fork hook).
            give_up = time.monotonic() + 1
            while True:
                try:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < give_up, "the child still holds the turn"
                    time.sleep(0.01)
        finally:
            os.close(other)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


def test_a_forked_child_forgets_the_turn_its_connection_held_and_never_closes_it_again():
    """A fork while the forking thread's transaction holds the turn: the child's copy of the
    connection must not close the turn's descriptors again (by then another file's)."""
    import fcntl
    import os

    from eventservice.sqlite.base import _close, _flock

    fd = _flock(_paths()[0], fcntl.LOCK_EX, 1)
    connection.ensure_connection()
    connection._writer = [fd]
    try:
        child = os.fork()
        if child == 0:
            os._exit(0 if connection._writer is None and connection._turn is None else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        connection._writer = None
        _close([fd])


def test_the_cursor_converts_placeholders_once_per_statement_and_long_ones_each_time():
    from eventservice.sqlite.base import CONVERSION_REMEMBERED_UP_TO, _qmark

    statement = "SELECT '100%%' || %s, %s + 1"
    with connection.cursor() as cursor:
        cursor.execute(statement, ["!", 41])
        assert cursor.fetchone() == ("100%!", 42)
        hits = _qmark.cache_info().hits
        cursor.execute(statement, ["?", 1])  # the same statement again: its conversion remembered
        assert cursor.fetchone() == ("100%?", 2)
        assert _qmark.cache_info().hits > hits

        # Longer than what is remembered: converted each time, and not kept.
        padding = "x" * CONVERSION_REMEMBERED_UP_TO
        long_statement = f"SELECT %s, length('{padding} 50%%')"
        kept = _qmark.cache_info().currsize
        for value in (7, 8):
            cursor.execute(long_statement, [value])
            assert cursor.fetchone() == (value, CONVERSION_REMEMBERED_UP_TO + 4)
        assert _qmark.cache_info().currsize == kept

        # Named parameters keep Django's own conversion.
        cursor.execute("SELECT %(a)s || %(b)s", {"a": "x", "b": "y"})
        assert cursor.fetchone() == ("xy",)


def test_it_creates_the_database_and_its_wal_files_readable_by_its_owner_only(tmp_path):
    """Mode 600 under a umask of 022, like backups: the file holds sealed secrets and key hashes."""
    import os
    import stat

    from eventservice.sqlite.base import DatabaseWrapper

    name = tmp_path / "event_service.db"
    own = DatabaseWrapper({**connection.settings_dict, "NAME": str(name)}, alias="modes")
    before = os.umask(0o022)
    try:
        with own.cursor() as cursor:
            cursor.execute("CREATE TABLE secrets (value TEXT)")
            cursor.execute("INSERT INTO secrets VALUES ('sealed')")
        files = [name, tmp_path / "event_service.db-wal", tmp_path / "event_service.db-shm"]
        assert all(path.exists() for path in files)
        assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in files} == {path.name: 0o600 for path in files}
    finally:
        os.umask(before)
        own.close()
