"""The write gate: one write transaction at a time among an engine's threads, the timer's first
(docs/architecture.md, "Where the loops run: inside django-q2")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from core.db import urgent_writes


class WriteGate:
    """One write transaction at a time among the engine's threads, the timer's first.

    SQLite has one write lock per database, and a connection that finds it taken sleeps in
    SQLite's busy handler (1, 2, 5, 10 ... 100 ms steps) while others take it in turn: the
    timer loop's start of a due call could wait hundreds of milliseconds behind the
    recorder and the dispatcher of its own process. Waiting here instead wakes a thread the
    moment the lock is free, and an urgent (timer) waiter goes before the others, then an
    early one (the outbox dispatcher: every delivery waits for its fan-out) at every other
    slot while others wait, then the rest in arrival order. On PostgreSQL it only orders this
    process's writers, which costs next to nothing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._urgent = 0
        self._early = 0
        # The others go in arrival order, so the recorder and the delivery loop take turns.
        self._next_ticket = 0
        self._serving = 0
        self._waiting = 0
        # Whether the last slot went to an early waiter: while others wait, an early waiter
        # gets every other slot at most (a dispatcher with a long backlog never shuts out the
        # recorder and the starts of its process).
        self._last_early = False

    @contextmanager
    def slot(self, *, urgent: bool = False, early: bool = False) -> Iterator[None]:
        with self._cond:
            if urgent:
                self._urgent += 1
                try:
                    while self._busy:
                        self._cond.wait()
                finally:
                    self._urgent -= 1
            elif early:
                self._early += 1
                try:
                    while self._busy or self._urgent or (self._last_early and self._waiting):
                        self._cond.wait()
                finally:
                    self._early -= 1
            else:
                ticket = self._next_ticket
                self._next_ticket += 1
                self._waiting += 1
                try:
                    while (
                        self._busy or self._urgent or (self._early and not self._last_early) or ticket != self._serving
                    ):
                        self._cond.wait()
                finally:
                    self._waiting -= 1
                self._serving += 1
            self._busy = True
            self._last_early = early
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    @contextmanager
    def urgent(self) -> Iterator[None]:
        # First in this process, and (on SQLite) before the other processes' writers.
        with self.slot(urgent=True), urgent_writes():
            yield

    def early(self) -> AbstractContextManager[None]:
        return self.slot(early=True)
