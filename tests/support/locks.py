"""Row locks held or tried from another connection (PostgreSQL tests of SKIP LOCKED and of what
a transaction locks): each runs in a thread of its own, so it has a connection of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import DatabaseError, connection, transaction
from django.db.models import Model

T = TypeVar("T")


@contextmanager
def row_locked_elsewhere(model: type[Model], pk: Any) -> Iterator[None]:
    """Another connection's transaction holds the row `pk` of `model` (FOR UPDATE) for the
    block; it rolls back afterwards."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(model.objects.select_for_update().filter(pk=pk))
                holding.set()
                release.wait(10)
                transaction.set_rollback(True)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10), "the other connection could not lock the row"
        yield
    finally:
        release.set()
        holder.join(10)


def in_another_connection(work: Callable[[], T]) -> T:
    """`work()`, run in a thread of its own (its own connection)."""
    result: list[T] = []

    def run() -> None:
        try:
            result.append(work())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    return result[0]


def locks_at_once(model: type[Model], pk: Any) -> bool:
    """Whether this connection can lock the row now (FOR UPDATE NOWAIT), in a transaction it
    rolls back; False when another transaction holds it."""
    try:
        with transaction.atomic():
            list(model.objects.select_for_update(nowait=True).filter(pk=pk))
            transaction.set_rollback(True)
        return True
    except DatabaseError:
        return False


@contextmanager
def paused_in_another_connection(work: Callable[[], T], *, before: Callable[[str], bool]) -> Iterator[list]:
    """`work()` in a transaction of another connection, paused for the block just before the
    first statement for which `before(sql)` is true (what it ran until then holds its locks).
    After the block it goes on; the list yielded then holds its result or its exception."""
    outcome: list = []
    paused, go_on = threading.Event(), threading.Event()

    def pause(execute, sql, params, many, context):
        if not paused.is_set() and before(sql):
            paused.set()
            go_on.wait(10)
        return execute(sql, params, many, context)

    def run() -> None:
        try:
            with connection.execute_wrapper(pause), transaction.atomic():
                outcome.append(work())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcome.append(exc)
        finally:
            paused.set()
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert paused.wait(10), "the other connection's work never reached the statement"
        assert not outcome, f"the other connection's work ended before the statement: {outcome}"
        yield outcome
    finally:
        go_on.set()
        thread.join(10)
