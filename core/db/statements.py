"""Statements for hot paths, built once per process: the reads that loops run many times a second
(sql_query), an UPDATE that reads back what it wrote, a statement run for many rows, rows by
key, and how their values are passed and read back.

The ORM compiles every statement again on every call, which cost those loops more CPU than the
database's own work.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model

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


def sql_update_returning(
    model: type[Model],
    *,
    assign: str,
    params: Sequence[Any],
    keys: Sequence[Any],
    returning: str,
    also: str = "",
    also_params: Sequence[Any] = (),
) -> list[tuple[Any, ...]]:
    """UPDATE the rows of `model` whose key is among `keys` (SET `assign`, with `params`) and
    read back `returning` of each: templates as for sql_query, the model named `t` ({t.field}).
    `also` (with `also_params`) is added to the WHERE as it is (" AND ..."). One UPDATE ...
    RETURNING where the database has it (SQLite 3.35+, PostgreSQL), else an UPDATE then a
    SELECT, which the caller's transaction keeps together. Rows in no set order."""
    where = f"WHERE {{t.{model._meta.pk.name}}} IN ({', '.join(['%s'] * len(keys))}){also}"
    update = f"UPDATE {{t}} SET {assign} {where}"
    if connections[DEFAULT_DB_ALIAS].features.can_return_columns_from_insert:
        return sql_query(f"{update} RETURNING {returning}", [*params, *keys, *also_params], t=model)
    sql_query(update, [*params, *keys, *also_params], t=model)
    return sql_query(f"SELECT {returning} FROM {{t}} {where}", [*keys, *also_params], t=model)


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
