"""Django's SQLite backend, waiting for the write lock in fine steps.

SQLite has one write lock per database. A connection that finds it taken waits in SQLite's
busy handler, which sleeps 1, 2, 5, 10 ... up to 100 ms between tries: a writer may sleep
for tens of milliseconds after the lock was freed, and under many writers (web threads,
worker processes) the tail latency of a write reaches a second. Here `BEGIN IMMEDIATE` (the
start of every atomic block, see settings) polls for the lock every 0.2-2 ms instead, within
the same overall timeout; statements outside atomic blocks keep SQLite's busy handler.
"""

from __future__ import annotations

import sqlite3
import time

from django.db.backends.sqlite3 import base

FIRST_STEP = 0.0005
LONGEST_STEP = 0.005


class DatabaseWrapper(base.DatabaseWrapper):
    def _start_transaction_under_autocommit(self) -> None:
        if self.transaction_mode is None:
            return super()._start_transaction_under_autocommit()
        with self.wrap_database_errors:  # raise Django's OperationalError, as the ORM would
            self._begin_polling()

    def _begin_polling(self) -> None:
        timeout_s = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
        raw = self.connection
        raw.execute("PRAGMA busy_timeout = 0")
        try:
            deadline = time.monotonic() + timeout_s
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
