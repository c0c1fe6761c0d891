"""Batched writes with statements built once per process: an UPDATE of many rows with
executemany (update_many), an INSERT of a few model instances (insert_prepare, insert_new),
of rows given as values (insert_rows_prepare, insert_many).

The ORM compiles one UPDATE per row (or a CASE per field per row with bulk_update), which
costs more CPU than the database work when a worker records a hundred outcomes at once; and it
compiles every INSERT again, which costs a submission more than the database's own work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import AutoField, DateTimeField, Field, Model
from django.db.models.fields import AutoFieldMixin

from core.db.statements import _STATEMENTS_LOCK
from core.db.values import Saver, saver


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
