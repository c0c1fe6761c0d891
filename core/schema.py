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

from typing import Any

from django.db import DEFAULT_DB_ALIAS, NotSupportedError, connections
from django.db.migrations.operations import AddIndex, AlterField
from django.db.models import Index


class AddIndexConcurrently(AddIndex):
    """AddIndex built concurrently on PostgreSQL; the same state change as AddIndex."""

    def describe(self) -> str:
        return f"{super().describe()} (concurrently on PostgreSQL)"

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, **_concurrently(schema_editor))

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, **_concurrently(schema_editor))


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
        for name in sorted(names):
            schema_editor.execute(schema_editor._delete_index_sql(model, name, **_concurrently(schema_editor)))

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
