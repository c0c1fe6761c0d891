"""Statements for hot paths, built once per process: batched writes (an UPDATE of many rows
with executemany, an INSERT of a few model instances), rows by key, and the reads that loops
run many times a second (sql_query).

The ORM compiles one UPDATE per row (or a CASE per field per row with bulk_update), which
costs more CPU than the database work when a worker records a hundred outcomes at once; and it
compiles every INSERT again, which costs a submission more than the database's own work.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from operator import attrgetter
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections, transaction
from django.db.models import (
    AutoField,
    BigIntegerField,
    BooleanField,
    CharField,
    DateTimeField,
    Field,
    ForeignKey,
    IntegerField,
    Model,
    PositiveIntegerField,
    PositiveSmallIntegerField,
    SmallIntegerField,
    TextField,
    UUIDField,
)
from django.db.models.fields import AutoFieldMixin
from django.db.transaction import TransactionManagementError


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


# Guards the writes to the statement caches (_QUERIES, _SELECTS, _INSERTS).
_STATEMENTS_LOCK = threading.Lock()


class _Names:
    """A model's quoted names for sql_query's templates: str() is its table, an attribute its
    field's column ({c.due_at}, {n.subscription})."""

    def __init__(self, model: type[Model], quote: Any) -> None:
        self._model, self._quote = model, quote

    def __str__(self) -> str:
        return self._quote(self._model._meta.db_table)

    def __getattr__(self, name: str) -> str:
        return self._quote(self._model._meta.get_field(name).column)


# sql_query's statements by template, models and vendor.
_QUERIES: dict[tuple[Any, ...], str] = {}


def sql_query(template: str, params: Sequence[Any] = (), **models: type[Model]) -> list[tuple[Any, ...]]:
    """The rows of `template`, SQL written against the names of `models`: {name} is the quoted
    table of the model passed as `name`, {name.field} the quoted column of one of its fields.
    For the reads that loops run many times a second, whose ORM compilation cost more than the
    database's work: the statement is formatted once per process and database vendor. Datetimes
    and UUIDs among `params` are adapted as the ORM stores them; read values back with
    `db_uuid` and `db_datetime`."""
    conn = connections[DEFAULT_DB_ALIAS]
    with conn.cursor() as cursor:
        adapt = _adapter(conn)
        cursor.execute(_formatted(conn, template, models), [adapt(value) for value in params])
        return cursor.fetchall() if cursor.description is not None else []


class ChangeWatch:
    """Whether a loop's poll may skip its read: nothing was committed since its last read, which
    found nothing.

    The engine's loops look for work ten to fifty times a second and, while the agent is idle,
    find none. On SQLite, `PRAGMA data_version` of the loop's own connection moves whenever
    another connection commits (another process's, or another thread's of this process; never
    this connection's own): while it stands still since a read that found nothing, the same read
    would find nothing again, but for what falls due by the clock alone (a retry, a lease), which
    `recheck` bounds: a read is never skipped more than `recheck` seconds after the last one. The
    pragma reads one word of the WAL index, where each poll's read planned and ran a statement
    (docs/architecture.md, "Where the loops run"). Elsewhere (PostgreSQL, a database in memory)
    every poll reads.

    A loop whose own writes can make work for its own read must not skip across them: it reports
    such a read as having found something, or calls `forget`. One watch per loop, used from that
    loop's thread.

        rows = watch.read(lambda: poll_query(), empty=[])  # what it returns, if true, is found
    """

    def __init__(self, *, recheck: float) -> None:
        self.recheck = recheck
        # The connection, its data_version and the time of the last read, if it found nothing.
        self._quiet: tuple[Any, int, float] | None = None

    def mark(self) -> tuple[Any, int, float] | None:
        """Before the read: None if it may be skipped, else what to pass to `done`. Taken before
        the read, so that a commit made while the read runs is seen by the next mark."""
        conn = connections[DEFAULT_DB_ALIAS]
        if conn.vendor != "sqlite" or conn.is_in_memory_db():
            return _EVERY_READ
        conn.ensure_connection()
        raw = conn.connection
        version = raw.execute("PRAGMA data_version").fetchone()[0]
        now = time.monotonic()
        quiet = self._quiet
        if quiet is not None and quiet[0] is raw and quiet[1] == version and now - quiet[2] < self.recheck:
            return None
        return (raw, version, now)

    def done(self, mark: tuple[Any, int, float], *, found: bool) -> None:
        """After the read: whether it found anything."""
        self._quiet = None if found or mark is _EVERY_READ else mark

    def read(self, read: Callable[[], T], *, empty: T) -> T:
        """What `read()` returns (found: if true), or `empty` when the read may be skipped."""
        mark = self.mark()
        if mark is None:
            return empty
        result = read()
        self.done(mark, found=bool(result))
        return result

    def forget(self) -> None:
        """The next read is not skipped (the loop was told that there may be work)."""
        self._quiet = None


_EVERY_READ: tuple[Any, int, float] = (None, -1, 0.0)


def sql_update_returning(
    model: type[Model], *, assign: str, params: Sequence[Any], keys: Sequence[Any], returning: str
) -> list[tuple[Any, ...]]:
    """UPDATE the rows of `model` whose key is among `keys` (SET `assign`, with `params`) and
    read back `returning` of each: templates as for sql_query, the model named `t` ({t.field}).
    One UPDATE ... RETURNING where the database has it (SQLite 3.35+, PostgreSQL), else an
    UPDATE then a SELECT, which the caller's transaction keeps together. Rows in no set order."""
    where = f"WHERE {{t.{model._meta.pk.name}}} IN ({', '.join(['%s'] * len(keys))})"
    update = f"UPDATE {{t}} SET {assign} {where}"
    if connections[DEFAULT_DB_ALIAS].features.can_return_columns_from_insert:
        return sql_query(f"{update} RETURNING {returning}", [*params, *keys], t=model)
    sql_query(update, [*params, *keys], t=model)
    return sql_query(f"SELECT {returning} FROM {{t}} {where}", keys, t=model)


def sql_execute_many(template: str, rows: Sequence[Sequence[Any]], **models: type[Model]) -> None:
    """Run `template` (written as for sql_query) once for each of `rows` (executemany), its
    values adapted as sql_query adapts them: the batch writes of hot loops, with no model
    instance and no per-field preparation for each row."""
    if not rows:
        return
    conn = connections[DEFAULT_DB_ALIAS]
    with conn.cursor() as cursor:
        adapt = _adapter(conn)
        cursor.executemany(_formatted(conn, template, models), [[adapt(value) for value in row] for row in rows])


def _formatted(conn: Any, template: str, models: dict[str, type[Model]]) -> str:
    key = (template, tuple(models.items()), conn.vendor)
    sql = _QUERIES.get(key)
    if sql is None:
        quote = conn.ops.quote_name
        sql = template.format(**{name: _Names(model, quote) for name, model in models.items()})
        with _STATEMENTS_LOCK:
            _QUERIES[key] = sql
    return sql


def _adapter(conn: Any) -> Callable[[Any], Any]:
    """How sql_query passes a value on `conn`: a datetime or a UUID as the ORM stores it. For an
    aware datetime on SQLite, what `adapt_datetimefield_value` makes of it (the text of the naive
    time in the connection's zone), with the settings it reads read once per statement rather
    than once per value: the record of a batch of delivery tries passes hundreds."""
    vendor_adapt = conn.ops.adapt_datetimefield_value
    if conn.vendor == "sqlite" and settings.USE_TZ:
        zone = conn.timezone

        def adapt_datetime(value: datetime) -> Any:
            if value.tzinfo is None:
                return vendor_adapt(value)
            return str(value.astimezone(zone).replace(tzinfo=None))
    else:
        adapt_datetime = vendor_adapt
    uuid_as_hex = not conn.features.has_native_uuid_field

    def adapt(value: Any) -> Any:
        if isinstance(value, datetime):
            return adapt_datetime(value)
        if uuid_as_hex and isinstance(value, uuid.UUID):
            return value.hex
        return value

    return adapt


def db_param(value: Any) -> Any:
    """`value` as sql_query passes it: what a raw read of its column gives back, so that many
    rows read can be compared with a few values made this way rather than each turned back."""
    return _adapter(connections[DEFAULT_DB_ALIAS])(value)


def db_uuid(value: Any) -> uuid.UUID:
    """A UUID column's value as read: a UUID on PostgreSQL, 32 hex digits on SQLite."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(value)


def db_datetime(value: Any) -> datetime:
    """A datetime column's value as read, aware (SQLite gives it naive, in the connection's
    time zone, or as text)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=connections[DEFAULT_DB_ALIAS].timezone)


@dataclass(frozen=True)
class _KeyRead:
    """A `rows_by_key` read: its SELECT, and how its rows become model instances."""

    sql: str
    # The attnames of the selected columns, in the model's field order (Model.from_db's).
    names: tuple[str, ...]
    # (position, column, converters) where a column has any: each converter a function and
    # whether it is the backend's (a method of the connection's `ops`, called on the `ops` of
    # the connection that reads: each thread has its own) or the field's.
    converters: tuple[tuple[int, Any, tuple[tuple[Callable[..., Any], bool], ...]], ...]


# The reads of `rows_by_key` by model, fields, key count, conditions, lock and vendor.
_SELECTS: dict[tuple[Any, ...], _KeyRead] = {}
_KEY_OPERATORS = {"exact": "=", "lte": "<="}


def rows_by_key(
    model: type[Model],
    *,
    keys: Sequence[Any],
    fields: Sequence[str] | None = None,
    where: dict[str, Any] | None = None,
    skip_locked: bool = False,
) -> list[Model]:
    """The rows of `model` whose key is among `keys` and that meet `where` ({"field": value} or
    {"field__lte": value}), with only `fields` loaded (None: every field). With `skip_locked`,
    locked for the caller's transaction: FOR UPDATE SKIP LOCKED on PostgreSQL (a row another
    transaction holds is left out); on SQLite the write transaction already keeps other writers
    out. What the ORM's `filter(pk__in=keys, **where).only(*fields)` runs (with
    `.select_for_update(skip_locked=True)`), its statement built once per process instead of
    compiled on every call (the timer's start of one due call paid more for that compilation
    than for the database's work); its rows become instances as a raw queryset makes them (the
    fields' converters, Model.from_db), with what that works out on every call worked out once."""
    if not keys:
        return []
    conn = connections[DEFAULT_DB_ALIAS]
    meta = model._meta
    names = [field.name for field in meta.concrete_fields] if fields is None else list(fields)
    lookups = [
        (name.partition("__")[0], name.partition("__")[2] or "exact", value) for name, value in (where or {}).items()
    ]
    for name, op, value in lookups:
        if op not in _KEY_OPERATORS or value is None:
            raise ValueError(f"rows_by_key: {name}__{op} = {value!r} is not an = or <= of a value")
    key = (model, tuple(names), len(keys), tuple((name, op) for name, op, _ in lookups), skip_locked, conn.vendor)
    read = _SELECTS.get(key)
    if read is None:
        read = _key_read(conn, model, names, len(keys), lookups, skip_locked)
        with _STATEMENTS_LOCK:
            _SELECTS[key] = read
    params = [meta.pk.get_db_prep_value(value, conn) for value in keys] + [
        meta.get_field(name).get_db_prep_value(value, conn) for name, _, value in lookups
    ]
    with conn.cursor() as cursor:
        cursor.execute(read.sql, params)
        rows = cursor.fetchall()
    if read.converters:
        rows = [_converted(list(row), read.converters, conn) for row in rows]
    return [model.from_db(conn.alias, read.names, row) for row in rows]


def _key_read(
    conn: Any, model: type[Model], names: list[str], keys: int, lookups: list[tuple[str, str, Any]], skip_locked: bool
) -> _KeyRead:
    meta = model._meta
    quote = conn.ops.quote_name
    wanted = {meta.get_field(name).attname for name in names} | {meta.pk.attname}
    selected = [model_field for model_field in meta.concrete_fields if model_field.attname in wanted]
    conditions = [f"{quote(meta.pk.column)} IN ({', '.join(['%s'] * keys)})"] + [
        f"{quote(meta.get_field(name).column)} {_KEY_OPERATORS[op]} %s" for name, op, _ in lookups
    ]
    sql = (
        f"SELECT {', '.join(quote(model_field.column) for model_field in selected)} FROM {quote(meta.db_table)} "
        f"WHERE {' AND '.join(conditions)}"
    )
    if skip_locked and conn.features.has_select_for_update_skip_locked:
        sql += " FOR UPDATE SKIP LOCKED"
    # What SQLCompiler.get_converters finds for each column of a raw queryset.
    converters = []
    for position, model_field in enumerate(selected):
        column = model_field.get_col(meta.db_table)
        found = [
            (function.__func__, True) if getattr(function, "__self__", None) is conn.ops else (function, False)
            for function in conn.ops.get_db_converters(column) + column.get_db_converters(conn)
        ]
        if found:
            converters.append((position, column, tuple(found)))
    return _KeyRead(sql, tuple(model_field.attname for model_field in selected), tuple(converters))


def _converted(
    row: list[Any], converters: tuple[tuple[int, Any, tuple[tuple[Callable[..., Any], bool], ...]], ...], conn: Any
) -> list:
    for position, column, functions in converters:
        value = row[position]
        for convert, on_ops in functions:
            value = convert(conn.ops, value, column, conn) if on_ops else convert(value, column, conn)
        row[position] = value
    return row


def update_many(
    model: type[Model],
    *,
    set_fields: Sequence[str],
    where_fields: Sequence[str],
    rows: Sequence[Sequence[Any]],
    where_extra: dict[str, Any] | None = None,
    set_constants: dict[str, Any] | None = None,
) -> int:
    """UPDATE model SET set_fields [, set_constants] WHERE where_fields (= each row's trailing
    values) [AND where_extra]; returns how many rows it changed.

    Each row holds the values of set_fields then where_fields, as Python values; they are
    prepared by the model's fields, as the ORM would. The values the same for every row
    (`set_constants`, `where_extra`) are prepared once.
    """
    if not rows:
        return 0
    meta = model._meta
    set_model_fields = [meta.get_field(name) for name in set_fields]
    where_model_fields = [meta.get_field(name) for name in where_fields]
    constants = set_constants or {}
    constant_fields = [meta.get_field(name) for name in constants]
    extra = where_extra or {}
    extra_fields = [meta.get_field(name) for name in extra]
    conn = connections[DEFAULT_DB_ALIAS]  # once: each use of the `connection` proxy looks it up
    quote = conn.ops.quote_name
    sql = (
        f"UPDATE {quote(meta.db_table)} SET "
        + ", ".join(f"{quote(f.column)} = %s" for f in [*set_model_fields, *constant_fields])
        + " WHERE "
        + " AND ".join(f"{quote(f.column)} = %s" for f in [*where_model_fields, *extra_fields])
    )

    def prepared(savers: Sequence[Saver], values: Sequence[Any]) -> list[Any]:
        return [save(v, conn) for save, v in zip(savers, values, strict=True)]

    constant_values = prepared([saver(f, conn) for f in constant_fields], list(constants.values()))
    extra_values = prepared([saver(f, conn) for f in extra_fields], list(extra.values()))
    set_savers = [saver(f, conn) for f in set_model_fields]
    where_savers = [saver(f, conn) for f in where_model_fields]
    split = len(set_fields)
    params = [
        prepared(set_savers, row[:split]) + constant_values + prepared(where_savers, row[split:]) + extra_values
        for row in rows
    ]
    with conn.cursor() as cursor:
        cursor.executemany(sql, params)
        return cursor.rowcount


# --- Values prepared for the database -------------------------------------------------------

# A field's value made ready for the database as `field.get_db_prep_save(value, conn)` makes it,
# cheaper for the values the hot paths write (str, int, bool, an aware datetime, a UUID), by
# field and vendor: the ORM's chain (get_db_prep_save, get_db_prep_value, get_prep_value,
# to_python, each looking up the connection's features and operations) cost more than the
# INSERT of a submission's rows. Any other value, or any other kind of field, takes the
# field's own method.
Saver = Callable[[Any, Any], Any]
_SAVERS: dict[tuple[int, str], Saver] = {}  # by id(field): a field lives as long as its model
_INTEGER_FIELDS = (
    IntegerField,
    BigIntegerField,
    SmallIntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
)


def saver(field: Field, conn: Any) -> Saver:
    """`(value, conn) -> database value` for `field` on `conn`'s database: `field.get_db_prep_save`."""
    key = (id(field), conn.vendor)
    found = _SAVERS.get(key)
    if found is None:
        found = _SAVERS.setdefault(key, _make_saver(field, conn))
    return found


def _make_saver(field: Field, conn: Any) -> Saver:
    slow = field.get_db_prep_save
    kind = type(field)
    if kind is ForeignKey:
        target = saver(field.target_field, conn)
        return lambda value, conn: (
            target(value, conn) if isinstance(value, (str, uuid.UUID)) and value != "" else slow(value, conn)
        )
    if kind in (CharField, TextField):
        # to_python: a str (a TextChoices member too) is kept as it is.
        return lambda value, conn: value if value is None or isinstance(value, str) else slow(value, conn)
    if kind in _INTEGER_FIELDS:
        internal = field.get_internal_type()
        # The vendor's adaptation (PostgreSQL's sized integer types) of an int kept as it is.
        return lambda value, conn: (
            conn.ops.adapt_integerfield_value(value, internal)
            if value is None or type(value) is int
            else slow(value, conn)
        )
    if kind is BooleanField:
        return lambda value, conn: value if value is None or type(value) is bool else slow(value, conn)
    if isinstance(field, AutoFieldMixin):
        # A key the database made (the outbox's, the attempt log's): an int kept as it is, as
        # AutoFieldMixin.get_db_prep_value keeps it, then checked by the vendor.
        return lambda value, conn: conn.ops.validate_autopk_value(value) if type(value) is int else slow(value, conn)
    if kind is UUIDField:
        if conn.features.has_native_uuid_field:
            return lambda value, conn: value if value is None or type(value) is uuid.UUID else slow(value, conn)
        return lambda value, conn: (
            value.hex if type(value) is uuid.UUID else None if value is None else slow(value, conn)
        )
    if kind is DateTimeField:
        # An aware datetime needs no warning nor conversion first: the vendor's adaptation only.
        return lambda value, conn: (
            conn.ops.adapt_datetimefield_value(value)
            if type(value) is datetime and value.tzinfo is not None
            else None
            if value is None
            else slow(value, conn)
        )
    return slow


def _getter(field: Field) -> Callable[[Model], Any] | None:
    """The value an INSERT of a new instance writes (`field.pre_save(obj, add=True)`), read as the
    attribute where pre_save does nothing else; None where it does (auto_now, ...)."""
    kind = type(field)
    if kind is DateTimeField and (field.auto_now or field.auto_now_add):
        return None
    if type(field).pre_save is not Field.pre_save and kind is not DateTimeField:
        return None
    return attrgetter(field.attname)


def _insert_fields(model: type[Model]) -> list[Field]:
    """The fields an INSERT of new instances writes: every concrete one but the generated ones
    and the auto-increment key."""
    return [f for f in model._meta.concrete_fields if not f.generated and not isinstance(f, AutoField)]


# How an INSERT of a model's new instances reads and prepares each field's value (those of
# `_insert_fields`, in its order), by model and vendor.
_VALUE_PLANS: dict[tuple[type[Model], str], list[tuple[Saver, Callable[[Model], Any]]]] = {}


def _instance_values(objs: Sequence[Model], conn: Any) -> list[Any]:
    """The values an INSERT of `objs` writes into `_insert_fields`, as the ORM prepares them."""
    key = (type(objs[0]), conn.vendor)
    plan = _VALUE_PLANS.get(key)
    if plan is None:
        plan = []
        for model_field in _insert_fields(type(objs[0])):
            getter = _getter(model_field)
            if getter is None:
                getter = partial(_pre_save_new, model_field)
            plan.append((saver(model_field, conn), getter))
        plan = _VALUE_PLANS.setdefault(key, plan)
    return [save(get(obj), conn) for obj in objs for save, get in plan]


def _pre_save_new(model_field: Field, obj: Model) -> Any:
    return model_field.pre_save(obj, True)


# INSERT statements by model, row count, columns and database vendor: (sql, fields), or None
# where bulk_create does the work.
_INSERTS: dict[tuple[Any, ...], tuple[str, list[Field]] | None] = {}
# Larger batches go through bulk_create. Up to the engine's batches (100 starts, outcomes or
# events): bulk_create compiled 48 outbox rows in 3-4 ms, inside the write transaction of a
# start that the next due timers wait for.
INSERT_MAX_ROWS = 100


@dataclass(frozen=True)
class PreparedInsert:
    """One INSERT with its statement and values ready (`insert_prepare`, `insert_rows_prepare`):
    made before a transaction, run inside it, so the transaction holds the write lock only to
    write."""

    sql: str | None  # None: bulk_create writes `objs`
    params: list[Any]
    objs: Sequence[Model] = ()
    returning_pk: bool = False

    def run(self) -> None:
        conn = connections[DEFAULT_DB_ALIAS]
        if self.sql is None:
            if self.objs:
                type(self.objs[0])._base_manager.bulk_create(self.objs)
            return
        with conn.cursor() as cursor:
            cursor.execute(self.sql, self.params)
            returned = cursor.fetchall() if self.returning_pk else None
        for index, obj in enumerate(self.objs):
            if returned is not None:
                obj.pk = returned[index][0]
            obj._state.adding = False
            obj._state.db = conn.alias


_NOTHING = PreparedInsert(sql=None, params=[])


def insert_prepare(objs: Sequence[Model], *, returning_pk: bool = False) -> PreparedInsert:
    """The INSERT of unsaved instances of one model in one statement: `bulk_create` for a few
    rows, its statement built once per process instead of on every call.

    Values are prepared by the model's fields as the ORM prepares them (`pre_save`, then
    `get_db_prep_save`), now; an auto-increment key is left to the database and, with
    `returning_pk`, read back into the instances (RETURNING). Like `bulk_create`, running it
    sends no signals; it marks the instances saved.
    """
    if not objs:
        return _NOTHING
    conn = connections[DEFAULT_DB_ALIAS]  # once: each use of the `connection` proxy looks it up
    plan = _plan(conn, type(objs[0]), len(objs), returning_pk)
    if plan is None:
        return PreparedInsert(sql=None, params=[], objs=objs)
    sql, _ = plan
    params = _instance_values(objs, conn)
    return PreparedInsert(sql=sql, params=params, objs=objs, returning_pk=returning_pk)


def insert_rows_prepare(model: type[Model], *, fields: Sequence[str], rows: Sequence[Sequence[Any]]) -> PreparedInsert:
    """The INSERT of rows given as values of `fields` (Python values, prepared by the model's
    fields as the ORM would), its statement built once per process: for rows nobody reads back,
    with no instance made for them. The other columns must be nullable or have database
    defaults; the key is the database's."""
    if not rows:
        return _NOTHING
    conn = connections[DEFAULT_DB_ALIAS]
    key = (model, tuple(fields), len(rows), conn.vendor)
    plan = _INSERTS.get(key)
    if plan is None:
        meta = model._meta
        plan = _statement(conn, model, [meta.get_field(name) for name in fields], len(rows), returning_pk=False)
        with _STATEMENTS_LOCK:
            _INSERTS[key] = plan
    sql, model_fields = plan
    savers = [saver(field, conn) for field in model_fields]
    params = [save(value, conn) for row in rows for save, value in zip(savers, row, strict=True)]
    return PreparedInsert(sql=sql, params=params)


def insert_new(objs: Sequence[Model]) -> set[Any]:
    """INSERT unsaved instances of one model whose keys the caller made new (fresh ids),
    skipping each row that breaks a unique constraint (ON CONFLICT DO NOTHING); returns the keys
    of the rows it inserted, which marks those instances saved. In statements of at most
    INSERT_MAX_ROWS rows (fewer for a wide model), each `insert_prepare`'s statement (built
    once per process) with RETURNING of the keys: bulk_create with ignore_conflicts compiles it on every call and
    cannot tell which rows it inserted (where RETURNING or such a statement is not available,
    that is what runs, and the rows are read back)."""
    inserted: set[Any] = set()
    if not objs:
        return inserted
    size = _rows_per_insert(connections[DEFAULT_DB_ALIAS], type(objs[0]))
    for first in range(0, len(objs), size):
        inserted |= _insert_new(objs[first : first + size])
    return inserted


def _insert_new(objs: Sequence[Model]) -> set[Any]:
    if not objs:
        return set()
    conn = connections[DEFAULT_DB_ALIAS]
    model = type(objs[0])
    meta = model._meta
    plan = _plan(conn, model, len(objs), False) if conn.features.can_return_rows_from_bulk_insert else None
    if plan is None:
        model._base_manager.bulk_create(objs, ignore_conflicts=True)
        # The keys were new: those that exist now are the rows this insert made.
        return set(model._base_manager.filter(pk__in=[obj.pk for obj in objs]).values_list("pk", flat=True))
    sql, _ = plan
    params = _instance_values(objs, conn)
    with conn.cursor() as cursor:
        cursor.execute(f"{sql} ON CONFLICT DO NOTHING RETURNING {conn.ops.quote_name(meta.pk.column)}", params)
        inserted = {meta.pk.to_python(row[0]) for row in cursor.fetchall()}
    for obj in objs:
        if obj.pk in inserted:
            obj._state.adding = False
            obj._state.db = conn.alias
    return inserted


def _rows_per_insert(conn: Any, model: type[Model]) -> int:
    """Rows per prepared INSERT of `model`: INSERT_MAX_ROWS, fewer where their values would pass
    the database's limit of parameters per statement (999 on SQLite, as Django assumes)."""
    return rows_per_insert(len(_insert_fields(model)), conn)


def rows_per_insert(columns: int, conn: Any = None) -> int:
    """Rows of `columns` values each that one prepared INSERT takes: INSERT_MAX_ROWS, fewer
    where their values would pass the database's limit of parameters per statement."""
    limit = (conn or connections[DEFAULT_DB_ALIAS]).features.max_query_params
    if limit is None:
        return INSERT_MAX_ROWS
    return max(1, min(INSERT_MAX_ROWS, limit // max(1, columns)))


def _plan(conn: Any, model: type[Model], rows: int, returning_pk: bool) -> tuple[str, list[Field]] | None:
    """The statement of `insert_prepare` and its fields, or None where bulk_create has to do
    it (many rows, a field with its own placeholder, no RETURNING of several rows)."""
    key = (model, rows, returning_pk, conn.vendor)
    plan = _INSERTS.get(key, False)
    if plan is not False:
        return plan
    meta = model._meta
    fields = _insert_fields(model)
    plan = None
    if (
        rows <= _rows_per_insert(conn, model)
        and not any(hasattr(f, "get_placeholder") for f in fields)
        and (not returning_pk or (isinstance(meta.pk, AutoField) and conn.features.can_return_rows_from_bulk_insert))
    ):
        plan = _statement(conn, model, fields, rows, returning_pk=returning_pk)
    with _STATEMENTS_LOCK:
        _INSERTS[key] = plan
    return plan


def _statement(
    conn: Any, model: type[Model], fields: list[Field], rows: int, *, returning_pk: bool
) -> tuple[str, list[Field]]:
    meta = model._meta
    quote = conn.ops.quote_name
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    columns = ", ".join(quote(f.column) for f in fields)
    sql = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES {', '.join([row] * rows)}"
    if returning_pk:
        sql += f" RETURNING {quote(meta.pk.column)}"
    return sql, fields


def insert_many(model: type[Model], *, rows: Sequence[dict[str, Any]], ignore_conflicts: bool = False) -> int:
    """INSERT rows given as {field name: Python value} with one prepared statement run for each
    row (executemany): for batches nobody reads back, with no instance made per row. A field a
    row leaves out takes its model default. With `ignore_conflicts`, a row that breaks a unique
    constraint is skipped (ON CONFLICT DO NOTHING, as bulk_create's ignore_conflicts). Returns
    how many rows were inserted.

    A value object repeated across rows (one event's envelope for each of its subscriptions, one
    timestamp for all) is prepared once: JSON is dumped once, not once per row."""
    rows = list(rows)  # every value object stays alive for the whole call (the cache below)
    if not rows:
        return 0
    conn = connections[DEFAULT_DB_ALIAS]
    fields = [f for f in model._meta.concrete_fields if not isinstance(f, AutoFieldMixin)]
    quote = conn.ops.quote_name
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})" + (" ON CONFLICT DO NOTHING" if ignore_conflicts else "")
    )
    # Prepared values by (field, the value object): the rows hold every object for the whole
    # call, so an id is never reused for another value while it is a key here.
    prepared: dict[tuple[str, int], tuple[Any, Any]] = {}
    # Constant defaults prepared once (a field without a default has one too: None, or "" for
    # text); a callable default (a new id, now) is called per row.
    defaults = {
        f.attname: f.get_db_prep_save(f.get_default(), conn)
        for f in fields
        if not f.has_default() or not callable(f.default)
    }

    def source(field: Field, keys: Any) -> Callable[[dict[str, Any]], Any]:
        """The prepared value of `field` in a row whose fields are `keys`."""
        name = field.name if field.name in keys else field.attname if field.attname in keys else None
        if name is None:
            if field.attname in defaults:
                constant = defaults[field.attname]
                return lambda row: constant
            return lambda row: field.get_db_prep_save(field.get_default(), conn)
        attname, save = field.attname, saver(field, conn)

        def value(row: dict[str, Any]) -> Any:
            raw = row[name]
            key = (attname, id(raw))
            hit = prepared.get(key)
            if hit is None or hit[0] is not raw:
                hit = prepared[key] = (raw, save(raw, conn))
            return hit[1]

        return value

    # Where each field's value comes from is worked out once for the rows that name the same
    # fields (a batch from one caller, the usual case), not for each field of each row.
    plans: dict[frozenset[str], list[Callable[[dict[str, Any]], Any]]] = {}
    params = []
    for row in rows:
        keys = frozenset(row)
        plan = plans.get(keys)
        if plan is None:
            plan = plans[keys] = [source(field, keys) for field in fields]
        params.append([value(row) for value in plan])
    with conn.cursor() as cursor:
        cursor.executemany(sql, params)
        return cursor.rowcount  # the sum over the rows (sqlite3, psycopg 3.1+)
