"""Write transactions: turns taken across processes (take_turn), the timer's writes first
(urgent_writes), and the writes of one process's threads sharing a transaction (group_commit,
docs/architecture.md, "The path of one call").
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from django.db import OperationalError, connection, transaction
from django.db.transaction import TransactionManagementError

from core.db.pool import pool_release


def take_turn(name: str) -> None:
    """Inside a transaction: wait until no other transaction, in any process, holds the turn
    called `name`, and hold it until this one ends. PostgreSQL: a transaction-level advisory
    lock on the name's hash. SQLite: nothing to do, its write transactions (BEGIN IMMEDIATE)
    already run one at a time."""
    if not connection.in_atomic_block:
        raise RuntimeError("take_turn must run inside a transaction")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [name])


@contextmanager
def one_transaction() -> Iterator[None]:
    """A pass of reads (and the odd write) as one transaction on PostgreSQL, whose server counts
    each statement outside a transaction as one: an idle loop's pass stays one transaction
    (docs/architecture.md, "Wake, don't poll"). On SQLite nothing: a transaction there takes
    the write lock (BEGIN IMMEDIATE), and its reads cost the server nothing."""
    if connection.vendor == "postgresql":
        with transaction.atomic():
            yield
    else:
        yield


_write_priority = threading.local()


@contextmanager
def urgent_writes() -> Iterator[None]:
    """This thread's write transactions go first: on SQLite, before those of the other
    processes that wait for the write lock (eventservice/sqlite/base.py). For the timer's
    starts of due calls, whose lateness is the time they wait."""
    before = writes_urgent()
    _write_priority.urgent = True
    try:
        yield
    finally:
        _write_priority.urgent = before


def writes_urgent() -> bool:
    return getattr(_write_priority, "urgent", False)


logger = logging.getLogger(__name__)

T = TypeVar("T")

# The most writes one shared transaction takes: it holds the write lock (on SQLite, the
# whole database's) for all of them, about 0.1-0.2 ms each, while a due timer may wait.
GROUP_COMMIT_MAX = 8


_PENDING = object()  # a write's result before it has one


@dataclass(eq=False)
class _GroupedWrite:
    work: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to lead the next transaction, not with an outcome
    result: Any = _PENDING
    error: BaseException | None = None

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        if self.result is _PENDING:
            # The thread that led its transaction stopped before writing it.
            raise OperationalError("the transaction this write shared ended before it was written")
        return self.result


class _GroupCommit:
    """The threads of one process that write at the same moment share one transaction.

    A write transaction's fixed cost is most of a small one's: the write turn and `BEGIN` on
    SQLite, and the commit, which writes every page the transaction touched (a submission
    touches a leaf page of each of its tables and indexes, and concurrent submissions touch
    the same ones). The first thread to arrive leads: it runs the writes queued by then, its
    own first, in one transaction, and commits once; the threads that arrive meanwhile wait,
    and the first of them leads the next transaction. Nobody waits for a batch to fill: a
    thread alone writes alone, as before (docs/architecture.md)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_GroupedWrite] = []
        self._leading = False

    def run(self, work: Callable[[], T]) -> T:
        if connection.in_atomic_block:
            # Inside the caller's own transaction, which decides whether it commits.
            with transaction.atomic():
                return work()
        write = _GroupedWrite(work)
        with self._lock:
            self._queue.append(write)
            lead = not self._leading
            self._leading = True
        if not lead:
            # The leader may need a connection (its on-commit hooks): a follower waits holding
            # none of its process's pool (core/db/pool.py).
            pool_release()
            try:
                write.done.wait()
            except BaseException:
                self._withdraw(write)
                raise
            if not write.lead:
                return write.outcome()
        batch: list[_GroupedWrite] = []
        try:
            with self._lock:
                batch = self._queue[:GROUP_COMMIT_MAX]
                del self._queue[:GROUP_COMMIT_MAX]
            self._commit(batch)
        finally:
            self._hand_over()
            for other in batch:
                if other is not write:
                    other.done.set()  # a write left without a result fails (outcome)
        return write.outcome()

    def _hand_over(self) -> None:
        """The first write still queued leads next; with none, the next to arrive leads."""
        with self._lock:
            if self._queue:
                following = self._queue[0]
                following.lead = True
                following.done.set()
            else:
                self._leading = False

    def _withdraw(self, write: _GroupedWrite) -> None:
        """A waiting thread interrupted (its wait raised): its write leaves the queue, and the
        lead, if it was just handed to it, goes on. A write a leader has taken is written."""
        with self._lock:
            if write in self._queue:
                self._queue.remove(write)
            handed = write.lead
        if handed:
            self._hand_over()

    @staticmethod
    def _commit(batch: list[_GroupedWrite]) -> None:
        # No savepoint per write (two more statements each, under the write lock): a write
        # that fails in a shared transaction leaves it (which is rolled back and made again
        # without it), and is made again alone, so that its outcome is the one it would have
        # had alone (on PostgreSQL, a lock wait turned deadlock by the sharing, say).
        pending, alone = batch, []
        while pending:
            stage: int | str = "begin"
            committed = []
            try:
                with transaction.atomic():
                    # First of the hooks: a later one that raises does not undo the commit (the
                    # hooks after that one are not run, as in any transaction of Django's).
                    transaction.on_commit(partial(committed.append, True))
                    for index, write in enumerate(pending):
                        stage = index
                        write.result = write.work()
                        if connection.needs_rollback:
                            raise TransactionManagementError(
                                "a grouped write caught a database error: the transaction cannot commit"
                            )
                    stage = "commit"
                break
            except BaseException as exc:
                if committed:
                    # The commit is done; an on_commit hook failed after it.
                    logger.exception("an on_commit hook of a grouped write failed")
                    if not isinstance(exc, Exception):
                        raise
                    break
                for write in pending:
                    write.result = _PENDING
                if not isinstance(exc, Exception):
                    raise
                if isinstance(stage, int) and len(pending) > 1:
                    alone.append(pending[stage])
                    pending = pending[:stage] + pending[stage + 1 :]
                elif stage == "commit" and len(pending) > 1:
                    # The commit failed (a deferred constraint is checked there): each alone,
                    # so that only the write at fault fails.
                    alone.extend(pending)
                    pending = []
                else:
                    # BEGIN failed (the write lock's timeout), or a write alone failed: none
                    # was written. Each caller gets its own exception (tracebacks are per raise).
                    for write in pending:
                        write.error = exc if write is pending[0] else _copy_error(exc)
                    pending = []
        for write in alone:
            _GroupCommit._commit([write])


def _copy_error(exc: Exception) -> Exception:
    try:
        copied = copy.copy(exc)
    except Exception:  # an exception that cannot be copied: a plain one that says what it was
        copied = OperationalError(f"{type(exc).__name__}: {exc}")
    copied.__traceback__ = None
    copied.__cause__ = exc
    return copied


_group_commit = _GroupCommit()


def _group_commit_after_fork() -> None:
    # A child starts with no write in flight: a fork copies the queue and the lock as another
    # thread of the parent may have left them.
    global _group_commit
    _group_commit = _GroupCommit()


os.register_at_fork(after_in_child=_group_commit_after_fork)


def group_commit(work: Callable[[], T]) -> T:
    """Run `work` in a transaction of its own, or in one shared with the writes other threads
    of this process start at the same moment (`_GroupCommit`): `work` writes as it would in
    `transaction.atomic()`, runs on whichever thread leads (the database connection is that
    thread's: `work` must use nothing else of its caller's thread), and its result or error
    comes back to the caller once the transaction has committed or failed. `work` may run more
    than once (another write of its transaction failed, which rolls it back): it must only
    write through the transaction, and must not catch a database error (a caught one fails its
    write). Inside a transaction, `work` runs in a savepoint of it."""
    return _group_commit.run(work)
