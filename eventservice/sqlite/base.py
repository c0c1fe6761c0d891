"""Django's SQLite backend, waiting for the write lock in fine steps.

SQLite has one write lock per database. A connection that finds it taken waits in SQLite's
busy handler, which sleeps 1, 2, 5, 10 ... up to 100 ms between tries: a writer may sleep
for tens of milliseconds after the lock was freed, and under many writers (web threads,
worker processes) the tail latency of a write reaches a second. Here `BEGIN IMMEDIATE` (the
start of every atomic block, see settings) polls for the lock every 0.2-2 ms instead, within
the same overall timeout; statements outside atomic blocks keep SQLite's busy handler.

Within one process, write transactions also take turns on a lock of the process first: the
next thread starts the moment the one before it commits, instead of finding out at its next
poll (a web worker's threads all writing submissions left the write lock idle between a commit
and the next writer's wake-up).

Across processes, the thread whose turn it is then takes an exclusive `flock` on a file beside
the database (`<database>-writer`) before `BEGIN`, and lets it go at the end of the
transaction: the kernel wakes the next process's writer the moment it is free. Polling alone
left SQLite's lock idle for up to a poll step after each commit, and in a burst (every worker
process starting, recording and publishing) the lock is what every call waits for. The
`flock` only orders the processes that take it; SQLite's own lock still decides, so a writer
that does not take it (a statement outside an atomic block, another program) is polled for as
before. A process that dies lets it go with its file descriptors.

Its cursor also remembers each statement's conversion from Django's `%s` placeholders to
SQLite's `?`: Django's own cursor runs a regular expression over the whole SQL of every
statement it executes, and the project runs the same few statements over and over (a
submission's INSERTs, the engine's and the delivery loop's prepared statements).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from functools import lru_cache

from django.db.backends.sqlite3 import base

from core.db import writes_urgent

FIRST_STEP = 0.0005
LONGEST_STEP = 0.005


# The process's write turn per database file (one lock each; a process may use several files).
_turns: dict[str, threading.Lock] = {}
_turns_guard = threading.Lock()

# The descriptors of this process that hold or wait for a flock of the processes' write turn.
_flock_fds: set[int] = set()
_flock_fds_guard = threading.Lock()
# The mode of each database's lock files: its own, so the users who may write it may take turns.
_modes: dict[str, int] = {}

# How often a timer's start looks for the processes' turn while a transaction holds it.
URGENT_FIRST_STEP = 0.0001
URGENT_LONGEST_STEP = 0.0005


def _after_fork_in_child() -> None:
    # A child starts with no turn held: a fork copies a lock another thread may hold, and a
    # copied descriptor would keep a flock held after its parent let it go.
    _turns.clear()
    for fd in list(_flock_fds):
        try:
            os.close(fd)
        except OSError:
            pass
    _flock_fds.clear()
    # The forking thread's own connections forget the turn they held: ending it in the child
    # would close those descriptors a second time, by then perhaps another file's (the
    # database's own), whose writes would then land in whatever took the number.
    from django.db import connections

    for wrapper in connections.all(initialized_only=True):
        if isinstance(wrapper, DatabaseWrapper):
            wrapper._writer = None
            wrapper._turn = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _turn_for(name: str) -> threading.Lock:
    turn = _turns.get(name)
    if turn is None:
        with _turns_guard:
            turn = _turns.setdefault(name, threading.Lock())
    return turn


def _writer_paths(name: str) -> tuple[str, str] | None:
    """The files whose `flock`s order the writers of `name`'s processes (the turn, and the
    urgent writers' claim on the next turn); None for a database in memory."""
    if not name or name == ":memory:" or name.startswith("file:"):
        return None
    return f"{name}-writer", f"{name}-writer-urgent"


def _open(path: str) -> int | None:
    """A descriptor of a lock file (made with its database's mode), or None where it cannot be
    opened (a read-only directory): SQLite's lock alone then orders the writers. Read-only:
    `flock` needs no more."""
    database = path.rpartition("-writer")[0]
    mode = _modes.get(database)
    if mode is None:
        try:
            mode = _modes.setdefault(database, os.stat(database).st_mode & 0o666)
        except OSError:
            mode = 0o600
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, mode)
    except OSError:
        return None
    with _flock_fds_guard:
        _flock_fds.add(fd)
    return fd


def _close(fds: list[int]) -> None:
    for fd in reversed(fds):
        with _flock_fds_guard:
            _flock_fds.discard(fd)
        os.close(fd)  # lets its flock go: the next writer wakes


def _create_private(name: str) -> None:
    """Create a database file that does not exist yet as mode 600 (as backups are), before
    SQLite would create it under the process's umask (644, readable by every user of the
    machine, sealed secrets and API key hashes included; docs/security.md, "Files at rest").
    SQLite gives its -wal and -shm files the database file's mode, and so does `_open` the
    lock files. An existing file keeps the mode its operator gave it."""
    if not name or name == ":memory:" or name.startswith("file:"):
        return
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    except OSError:  # a directory that cannot be written: SQLite reports it as it connects
        return
    os.close(fd)  # an empty file is an empty database to SQLite


def _locked() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("database is locked (by a writer of another process)")


def _flock(path: str, operation: int, timeout_s: float) -> int | None:
    """A `flock` (LOCK_EX or LOCK_SH) on `path`, held through the returned descriptor (close it
    with `_close` to let it go); None where the file cannot be opened or locked (SQLite's lock
    alone then orders the writers). Raises OperationalError after `timeout_s`, as SQLite's busy
    timeout would."""
    fd = _open(path)
    if fd is None:
        return None
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        pass
    except BaseException:
        _close([fd])
        raise
    # Held by another process: wait in a helper thread, as flock has no timeout. A helper given
    # up on closes its descriptor once its wait ends (nothing else shares the descriptor).
    done = threading.Event()
    guard = threading.Lock()
    state = {"locked": False, "given_up": False}

    def wait() -> None:
        try:
            fcntl.flock(fd, operation)
            locked = True
        except OSError:
            locked = False
        with guard:
            state["locked"] = locked
            if state["given_up"]:
                _close([fd])
            done.set()

    threading.Thread(target=wait, name="sqlite-writer-wait", daemon=True).start()
    try:
        done.wait(timeout_s)
    finally:
        with guard:
            if not done.is_set():
                state["given_up"] = True  # on a timeout, or anything that interrupts the wait
    if state["given_up"]:
        raise _locked()
    if not state["locked"]:
        _close([fd])
        return None
    return fd


def _take_turn(paths: tuple[str, str], deadline: float, *, urgent: bool) -> list[int]:
    """The processes' write turn (the returned descriptors hold it). An urgent writer first
    claims the next turn (LOCK_EX on the urgent file, one urgent writer at a time), then takes
    the turn as soon as the transaction in progress lets it go; any other writer that gets the
    turn while an urgent one waits gives it back and waits until the urgent writer is done.
    Raises OperationalError at `deadline`."""
    turn_path, urgent_path = paths
    held: list[int] = []
    try:
        if urgent:
            claim = _flock(urgent_path, fcntl.LOCK_EX, max(0.0, deadline - time.monotonic()))
            held += [claim] if claim is not None else []
            turn = _open(turn_path)
            if turn is None:
                return held
            held.append(turn)
            # Looked for in this thread in fine steps, not waited for in a helper thread: only the
            # transaction in progress is ahead (the others step back), and a helper's handoff
            # cost the timer's start one more wait for the GIL in a busy process.
            step = URGENT_FIRST_STEP
            while True:
                try:
                    fcntl.flock(turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return held
                except BlockingIOError:
                    pass
                if time.monotonic() >= deadline:
                    raise _locked()
                time.sleep(step)
                step = min(step * 1.5, URGENT_LONGEST_STEP)
        while True:
            turn = _flock(turn_path, fcntl.LOCK_EX, max(0.0, deadline - time.monotonic()))
            if turn is None:
                return held
            held.append(turn)
            probe = _open(urgent_path)
            if probe is None:
                return held
            try:
                fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return held  # no urgent writer waits
            except BlockingIOError:
                pass
            finally:
                _close([probe])
            # An urgent writer waits: the turn is its, then this writer's.
            _close(held)
            held = []
            waited = _flock(urgent_path, fcntl.LOCK_SH, max(0.0, deadline - time.monotonic()))
            _close([waited] if waited is not None else [])
    except BaseException:
        _close(held)
        raise


# A statement longer than this is converted each time: a bulk INSERT's SQL grows with its rows,
# and so would the memory of remembering each size.
CONVERSION_REMEMBERED_UP_TO = 8192


@lru_cache(maxsize=512)
def _qmark(query: str) -> str:
    return base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


class CursorWrapper(base.SQLiteCursorWrapper):
    """Django's SQLite cursor, its placeholder conversion remembered per statement."""

    def convert_query(self, query, *, param_names=None):
        if param_names is None and len(query) <= CONVERSION_REMEMBERED_UP_TO:
            return _qmark(query)
        return super().convert_query(query, param_names=param_names)


class DatabaseWrapper(base.DatabaseWrapper):
    # The process's write turn, while this connection's transaction holds it.
    _turn: threading.Lock | None = None
    # The descriptors of the processes' write turn, while this connection's transaction holds it.
    _writer: list[int] | None = None

    def get_new_connection(self, conn_params):
        _create_private(str(conn_params.get("database") or self.settings_dict["NAME"]))
        return super().get_new_connection(conn_params)

    def create_cursor(self, name=None):
        return self.connection.cursor(factory=CursorWrapper)

    def _start_transaction_under_autocommit(self) -> None:
        if self.transaction_mode is None:
            return super()._start_transaction_under_autocommit()
        timeout_s = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
        deadline = time.monotonic() + timeout_s
        with self.wrap_database_errors:  # raise Django's OperationalError, as the ORM would
            turn = _turn_for(str(self.settings_dict["NAME"]))
            if not turn.acquire(timeout=timeout_s):
                raise sqlite3.OperationalError("database is locked (by another thread of this process)")
            self._turn = turn
            try:
                paths = _writer_paths(str(self.settings_dict["NAME"]))
                if paths is not None:
                    self._writer = _take_turn(paths, deadline, urgent=writes_urgent())
                self._begin_polling(deadline)
            except BaseException:
                self._end_turn()
                raise

    def _end_turn(self) -> None:
        writer, self._writer = self._writer, None
        if writer:
            _close(writer)
        turn, self._turn = self._turn, None
        if turn is not None:
            turn.release()

    # The transaction ends (or the connection goes) whichever way: the next writer's turn.
    def _commit(self) -> None:
        try:
            return super()._commit()
        finally:
            self._end_turn()

    def _rollback(self) -> None:
        try:
            return super()._rollback()
        finally:
            self._end_turn()

    def _close(self) -> None:
        try:
            return super()._close()
        finally:
            self._end_turn()

    def _begin_polling(self, deadline: float) -> None:
        timeout_s = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
        raw = self.connection
        raw.execute("PRAGMA busy_timeout = 0")
        try:
            step = FIRST_STEP
            while True:
                try:
                    raw.execute(f"BEGIN {self.transaction_mode}")
                    return
                except sqlite3.OperationalError as exc:
                    message = str(exc)
                    if "locked" not in message and "busy" not in message:
                        raise
                    if time.monotonic() >= deadline:
                        raise
                time.sleep(step)
                step = min(step * 1.5, LONGEST_STEP)
        finally:
            raw.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
