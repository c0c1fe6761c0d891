"""Schema operations for migrations that must not stop the agent's writes while they run.

`DropForeignKeyIndex` takes away a foreign key's own index where a composite index leading with
its column answers the same lookups. Every row written also writes every index of its table, so
such an index costs each insert a page of its own and serves nothing (docs/schema.md, "Indexes
and the queries that use them"). Django would make the change (an AlterField to
`db_index=False`) on SQLite by copying the whole table; this drops the index alone.

A plain `CREATE INDEX` on PostgreSQL holds a lock that blocks every write to the table until
the index is built, which on a table of millions of rows stops the calls' event fan-out and the
deliveries for as long as the build reads the table. `AddIndexConcurrently` builds it with
`CREATE INDEX CONCURRENTLY` there instead (writes go on), and with a plain `CREATE INDEX`
elsewhere (SQLite builds it under its write lock either way). PostgreSQL refuses a concurrent
build inside a transaction, so its migration sets `atomic = AtomicElsewhere()`: no transaction
on PostgreSQL, one transaction for the whole migration elsewhere (docs/deploy.md, "Upgrades").
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, NotSupportedError, OperationalError, connections
from django.db.migrations.operations import AddIndex, AlterField
from django.db.migrations.operations.base import Operation
from django.db.models import Index

from core.partitions import (
    AHEAD_DAYS,
    DAY,
    DailyPartitions,
    day_start,
    forget_partitioning,
    is_partitioned,
    local_name,
    local_uniques,
)


class AddIndexConcurrently(AddIndex):
    """AddIndex built concurrently on PostgreSQL; the same state change as AddIndex.

    PostgreSQL builds no index of a partitioned table concurrently (PartitionByDay, below): the
    table's index is then made on it alone (invalid, a catalog entry), each partition's built
    concurrently and attached to it, and it is valid once every partition's is. Its way back
    drops it plainly, with every partition's (a catalog change, under a lock held as briefly)."""

    def describe(self) -> str:
        return f"{super().describe()} (concurrently on PostgreSQL)"

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            concurrently = _concurrently(schema_editor)
            if concurrently and is_partitioned(model._meta.db_table, using=schema_editor.connection.alias):
                _add_partitioned_index(schema_editor, model, self.index)
            else:
                schema_editor.add_index(model, self.index, **concurrently)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            concurrently = _concurrently(schema_editor)
            if is_partitioned(model._meta.db_table, using=schema_editor.connection.alias):
                concurrently = {}
            schema_editor.remove_index(model, self.index, **concurrently)


def _add_partitioned_index(schema_editor: Any, model: Any, index: Index) -> None:
    """Each partition's index built concurrently (writes go on; each build waits for the
    transactions open when it starts), then the table's made on it alone and the partitions'
    attached: two catalog changes whose locks hold writes for an instant, each waited for only
    BRIEF_LOCK_TIMEOUT at a time and tried again until had."""
    q = schema_editor.quote_name
    table = model._meta.db_table
    made = str(index.create_sql(model, schema_editor))
    head = f"CREATE INDEX {q(index.name)} ON {q(table)} "
    if not made.startswith(head):
        raise NotSupportedError(f"{index.name}: not an index this operation builds on a partitioned table: {made}")
    rest = made.removeprefix(head)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%s) ORDER BY 1",
            [q(table)],
        )
        names = [(row[0], local_name(row[0], index.name.removeprefix(f"{table}_"))) for row in cursor.fetchall()]
    # IF NOT EXISTS: a build interrupted, its invalid indexes dropped (docs/deploy.md,
    # "Upgrades"), goes on with the partitions it had not done.
    for partition, own in names:
        schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(own)} ON {q(partition)} {rest}")
    _briefly(schema_editor, f"CREATE INDEX IF NOT EXISTS {q(index.name)} ON ONLY {q(table)} {rest}")
    for _, own in names:
        _briefly(schema_editor, f"ALTER INDEX {q(index.name)} ATTACH PARTITION {q(own)}")


BRIEF_LOCK_TIMEOUT = "100ms"


def _briefly(schema_editor: Any, sql: str) -> None:
    """Run `sql`, a catalog change outside a transaction, waiting for its lock BRIEF_LOCK_TIMEOUT
    at a time (the writes queued behind it wait no longer), until it has it."""
    if schema_editor.collect_sql:
        schema_editor.execute(sql)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SET lock_timeout = '{BRIEF_LOCK_TIMEOUT}'")
        try:
            while True:
                try:
                    cursor.execute(sql)
                    return
                except OperationalError as exc:
                    if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
                        raise
                time.sleep(0.2)
        finally:
            cursor.execute("RESET lock_timeout")


class DropForeignKeyIndex(AlterField):
    """AlterField of a foreign key to `db_index=False`: the same state change, made in the
    database by dropping the field's own index alone (and PostgreSQL's pattern-ops twin of it,
    for a text key), where Django would copy the whole table on SQLite. On PostgreSQL the drop
    is concurrent (writes go on; the migration sets `atomic = AtomicElsewhere()`). The indexes
    are found in the database, as Django's AlterField finds the index it drops, so `sqlmigrate`
    shows the statements only for a database that still has them. The way back is Django's own
    AlterField: a plain CREATE INDEX on PostgreSQL, a copy of the table on SQLite."""

    def describe(self) -> str:
        return f"Drop the own index of {self.model_name}.{self.name} (made again on the way back)"

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        old = from_state.apps.get_model(app_label, self.model_name)._meta.get_field(self.name)
        new = model._meta.get_field(self.name)
        if not (old.many_to_one and old.db_index and not new.db_index and old.column == new.column):
            raise ValueError(f"{self.describe()}: the field must be a foreign key whose db_index goes to False")
        # The index Django's schema editor would remove (BaseDatabaseSchemaEditor._alter_field):
        # a plain index on the column alone that is not one of the model's declared indexes (a
        # partial index on the same column, say, stays).
        declared = {index.name for index in model._meta.indexes}
        names = schema_editor._constraint_names(
            model, [old.column], index=True, unique=False, primary_key=False, type_=Index.suffix, exclude=declared
        )
        concurrently = _concurrently(schema_editor)
        if is_partitioned(model._meta.db_table, using=schema_editor.connection.alias):
            concurrently = {}  # PostgreSQL drops no index of a partitioned table concurrently
        for name in sorted(names):
            schema_editor.execute(schema_editor._delete_index_sql(model, name, **concurrently))

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        # AlterField's way back is its way forward between the swapped states: Django's own.
        super().database_forwards(app_label, schema_editor, from_state, to_state)


class AtomicElsewhere:
    """A migration's `atomic` when it builds an index concurrently: False on PostgreSQL, where
    no transaction may hold the build; True elsewhere, so that an interrupted migration leaves
    nothing half done (SQLite, whose index is a plain one). It reads the default database's
    vendor, the only database the agent has (eventservice/settings.py)."""

    def __get__(self, migration: object, owner: type | None = None) -> bool:
        return connections[DEFAULT_DB_ALIAS].vendor != "postgresql"


def _concurrently(schema_editor: Any) -> dict[str, bool]:
    if schema_editor.connection.vendor != "postgresql":
        return {}
    if schema_editor.connection.in_atomic_block:
        raise NotSupportedError(
            "a concurrent index build cannot run in a transaction: set atomic = core.schema.AtomicElsewhere() on the migration"
        )
    return {"concurrently": True}


class PartitionByDay(Operation):
    """On PostgreSQL, the model's table becomes partitioned by day of `field` (a UUID v7 or a
    time: core/partitions.py); elsewhere, and in Django's state, nothing changes: the model still
    sees one table (docs/schema.md, "History partitioned by day").

    In the migration's transaction: the table is renamed `<table>_past`; a partitioned table
    takes its name, columns, checks, foreign keys and indexes (a unique index without the
    partition key stays on each partition: PostgreSQL cannot enforce it across them), and its
    identity sequence goes on where the old one was; the old table is attached as the partition
    of its keys, from the lowest to the day after its newest row (PostgreSQL reads it once to
    check that range; its indexes are taken as they are, none is built), or dropped when empty;
    then the DEFAULT partition and the partitions of the next days are made. Foreign keys of other
    tables that point at this one are dropped: dropping a partition would have to look for their
    rows first (docs/schema.md says which). Going back copies the rows into a plain table made as
    Django makes it."""

    reversible = True

    def __init__(self, model_name: str, field: str) -> None:
        self.model_name = model_name
        self.field = field

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__name__, [], {"model_name": self.model_name, "field": self.field}

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def describe(self) -> str:
        return f"Partition {self.model_name} by day of {self.field} (on PostgreSQL)"

    @property
    def migration_name_fragment(self) -> str:
        return f"partition_{self.model_name.lower()}"

    def _spec(self, model: Any) -> DailyPartitions:
        field = model._meta.get_field(self.field)
        kind = (field.target_field if field.is_relation else field).get_internal_type()
        return DailyPartitions(model._meta.db_table, field.column, uuid7=kind == "UUIDField")

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if schema_editor.connection.vendor == "postgresql" and self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            _partition(schema_editor, self._spec(model), now=datetime.now(UTC))
            forget_partitioning()

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if schema_editor.connection.vendor == "postgresql" and self.allow_migrate_model(
            schema_editor.connection.alias, model
        ):
            _unpartition(schema_editor, model, self._spec(model))
            forget_partitioning()


def _partition(schema_editor: Any, spec: DailyPartitions, *, now: datetime) -> None:
    q = schema_editor.quote_name
    run = schema_editor.execute
    table, past, key = spec.table, spec.past_name, spec.column
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.relname, pg_get_indexdef(x.indexrelid), con.contype, pg_get_constraintdef(con.oid) "
            "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "LEFT JOIN pg_constraint con ON con.conindid = x.indexrelid AND con.conrelid = x.indrelid "
            "WHERE x.indrelid = to_regclass(%s) ORDER BY i.relname",
            [q(table)],
        )
        indexes = cursor.fetchall()
        uniques = local_uniques(cursor, table, quote=q, column=key)
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass(%s) "
            "AND contype = 'f' ORDER BY conname",
            [q(table)],
        )
        foreign_keys = cursor.fetchall()
        cursor.execute(
            "SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE confrelid = to_regclass(%s) "
            "AND contype = 'f' ORDER BY 1, 2",
            [q(table)],
        )
        pointing = cursor.fetchall()
        cursor.execute(
            "SELECT attname, pg_get_serial_sequence(%s, attname) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attidentity <> '' ORDER BY attnum",
            [q(table), q(table)],
        )
        identities = cursor.fetchall()
        # Along the key's index (PostgreSQL 15 has no max() of a UUID).
        cursor.execute(f"SELECT {q(key)} FROM {q(table)} ORDER BY {q(key)} DESC LIMIT 1")
        newest = next(iter(cursor.fetchall()), (None,))[0]
    for referring, name in pointing:
        run(f"ALTER TABLE {referring} DROP CONSTRAINT {q(name)}")
    run(f"ALTER TABLE {q(table)} RENAME TO {q(past)}")
    local = {unique.name for unique in uniques}
    for name, *_ in indexes:
        run(f"ALTER INDEX {q(name)} RENAME TO {q(local_name(past, name.removeprefix(f'{table}_')))}")
    run(
        f"CREATE TABLE {q(table)} (LIKE {q(past)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE ({q(key)})"
    )
    for column, sequence in identities:
        # The new table's ids go on from the old one's (whose sequence goes with its identity).
        run(f"ALTER SEQUENCE {sequence} RENAME TO {q(local_name(past, 'old_seq'))}")
        run(f"ALTER TABLE {q(table)} ALTER COLUMN {q(column)} ADD GENERATED BY DEFAULT AS IDENTITY")
        old = q(local_name(past, "old_seq"))
        run(f"SELECT setval(pg_get_serial_sequence(%s, %s), last_value, is_called) FROM {old}", [q(table), column])
        run(f"ALTER TABLE {q(past)} ALTER COLUMN {q(column)} DROP IDENTITY")
    for name, definition, kind, constraint in indexes:
        if name in local:
            continue
        if kind in ("p", "u"):
            run(f"ALTER TABLE {q(table)} ADD CONSTRAINT {q(name)} {constraint}")
        else:
            unique = "UNIQUE " if definition.startswith("CREATE UNIQUE") else ""
            run(f"CREATE {unique}INDEX {q(name)} ON {q(table)}{definition[definition.index(' USING ') :]}")
    for name, definition in foreign_keys:
        run(f"ALTER TABLE {q(table)} ADD CONSTRAINT {q(name)} {definition}")
    # From yesterday's: the loops' window of the open rows begins there (core.partition_queries.OpenWindow).
    first = day_start(now) - DAY
    if newest is None:
        run(f"DROP TABLE {q(past)}")
    else:
        first = day_start(max(now, spec.time_of(newest))) + DAY
        run(
            f"ALTER TABLE {q(table)} ATTACH PARTITION {q(past)} FOR VALUES FROM (MINVALUE) TO (%s)",
            [spec.key_at(first)],
        )
    default = spec.default_name
    run(f"CREATE TABLE {q(default)} (LIKE {q(table)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    for unique in uniques:
        run(unique.statement(default, q))
    run(f"ALTER TABLE {q(table)} ATTACH PARTITION {q(default)} DEFAULT")
    day = first
    while day <= day_start(now) + AHEAD_DAYS * DAY:
        name = spec.partition_name(day.date())
        run(f"CREATE TABLE {q(name)} (LIKE {q(table)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        for unique in uniques:
            run(unique.statement(name, q))
        run(
            f"ALTER TABLE {q(table)} ATTACH PARTITION {q(name)} FOR VALUES FROM (%s) TO (%s)",
            [spec.key_at(day), spec.key_at(day + DAY)],
        )
        day += DAY


def _unpartition(schema_editor: Any, model: Any, spec: DailyPartitions) -> None:
    q = schema_editor.quote_name
    run = schema_editor.execute
    table, parted = spec.table, f"{spec.table}_parted"
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "WHERE x.indrelid = to_regclass(%s) ORDER BY 1",
            [q(table)],
        )
        names = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'c' ORDER BY 1",
            [q(table)],
        )
        checks = [row[0] for row in cursor.fetchall()]
    run(f"ALTER TABLE {q(table)} RENAME TO {q(parted)}")
    for name in names:
        run(f"ALTER INDEX {q(name)} RENAME TO {q(local_name(parted, name.removeprefix(f'{table}_')))}")
    # Out of the way of the names PostgreSQL gives the plain table's checks.
    for name in checks:
        run(
            f"ALTER TABLE {q(parted)} RENAME CONSTRAINT {q(name)} TO {q(local_name(parted, name.removeprefix(f'{table}_')))}"
        )
    schema_editor.create_model(model)
    columns = ", ".join(q(field.column) for field in model._meta.concrete_fields)
    run(f"INSERT INTO {q(table)} ({columns}) SELECT {columns} FROM {q(parted)}")
    for field in model._meta.concrete_fields:
        if field.get_internal_type() in ("AutoField", "BigAutoField", "SmallAutoField"):
            run(
                f"SELECT setval(pg_get_serial_sequence(%s, %s), coalesce(max({q(field.column)}), 1), "
                f"max({q(field.column)}) IS NOT NULL) FROM {q(table)}",
                [q(table), field.column],
            )
    run(f"DROP TABLE {q(parted)}")
