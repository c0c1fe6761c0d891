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
and the next writer's wake-up). Only writers of other processes are polled for.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

from django.db.backends.sqlite3 import base

FIRST_STEP = 0.0005
LONGEST_STEP = 0.005


# The process's write turn per database file (one lock each; a process may use several files).
_turns: dict[str, threading.Lock] = {}
_turns_guard = threading.Lock()


# A child process starts with no turn held (a fork copies a lock another thread may hold).
os.register_at_fork(after_in_child=_turns.clear)


def _turn_for(name: str) -> threading.Lock:
    turn = _turns.get(name)
    if turn is None:
        with _turns_guard:
            turn = _turns.setdefault(name, threading.Lock())
    return turn


class DatabaseWrapper(base.DatabaseWrapper):
    # The process's write turn, while this connection's transaction holds it.
    _turn: threading.Lock | None = None

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
                self._begin_polling(deadline)
            except BaseException:
                self._end_turn()
                raise

    def _end_turn(self) -> None:
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
