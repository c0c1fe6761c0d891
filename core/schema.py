"""Schema operations for migrations that must not stop the agent's writes while they run.

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
from django.db.migrations.operations import AddIndex


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
