"""core/schema.py's DropForeignKeyIndex, and the rule it serves: a foreign key has no index of its
own where a composite index leading with its column answers the same lookups, since every row
written writes every index of its table (docs/schema.md, "Indexes and the queries that use
them")."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState
from django.db.models import ForeignKey

from core.schema import DropForeignKeyIndex
from tests.support.agent_process import ROOT, agent_env, manage


def _leading_columns(model) -> set[str]:
    """The first column of each of the model's full (not partial) composite indexes and unique
    constraints."""
    meta = model._meta
    groups = [index.fields for index in meta.indexes if index.condition is None]
    groups += [constraint.fields for constraint in meta.total_unique_constraints]
    groups += [list(fields) for fields in meta.unique_together]
    return {meta.get_field(fields[0].lstrip("-")).column for fields in groups if len(fields) > 1}


def test_no_foreign_key_keeps_an_index_that_a_composite_one_leads_with():
    ours = [app for app in django_apps.get_app_configs() if Path(app.path).parent == ROOT]
    redundant = [
        f"{model._meta.label}.{field.name}"
        for app in ours
        for model in app.get_models()
        for field in model._meta.local_fields
        if isinstance(field, ForeignKey) and field.db_index and field.column in _leading_columns(model)
    ]
    assert redundant == []


SHOW = """
import json
from django.db import connection
from django.db.migrations.loader import MigrationLoader
with connection.cursor() as cursor:
    found = {}
    for table in ("event_notifications", "event_delivery_attempts"):
        names = connection.introspection.get_constraints(cursor, table)
        cursor.execute("SELECT rootpage FROM sqlite_master WHERE name = %s", [table])
        found[table] = {"indexes": sorted(names), "rootpage": cursor.fetchone()[0]}
print(json.dumps(found))
"""


def test_on_sqlite_the_index_goes_without_a_copy_of_the_table_and_comes_back(tmp_path):
    """On a fresh SQLite database, delivery 0004 undone and done again: the foreign keys' own
    indexes come back and go, a declared partial index on the same column stays, and going
    forward drops the index alone (the table keeps its root page: no copy)."""
    import json

    env = agent_env(tmp_path, SECRET_KEY="k" * 50)
    own = {
        "event_notifications": "event_notifications_subscription_id_7e4248bc",
        "event_delivery_attempts": "event_delivery_attempts_notification_id_c4ba99e9",
    }
    seen = []
    for target in ("0004", "0003", "0004"):
        result = manage(env, "migrate", "delivery", target)
        assert result.returncode == 0, result.stderr
        shown = manage(env, "shell", "--no-imports", "-c", SHOW)
        assert shown.returncode == 0, shown.stderr
        seen.append(json.loads(shown.stdout))
    for table, name in own.items():
        assert [name in state[table]["indexes"] for state in seen] == [False, True, False]
        assert seen[2][table]["rootpage"] == seen[1][table]["rootpage"]
    assert all("event_notifications_expired" in state["event_notifications"]["indexes"] for state in seen)


def test_it_refuses_a_field_that_is_not_a_foreign_key_losing_its_index():
    from tenants.models import ApiKey

    state = ProjectState.from_apps(ApiKey._meta.apps)
    operation = DropForeignKeyIndex(model_name="apikey", name="prefix", field=ApiKey._meta.get_field("prefix"))
    editor = connection.schema_editor()  # not entered: the refusal comes before any statement
    with pytest.raises(ValueError, match="foreign key"):
        operation.database_forwards("tenants", editor, state, state)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_the_index_and_its_pattern_ops_twin_are_dropped_concurrently():
    """The index as orchestration 0006 left it (Django's way back makes it again, with its
    varchar_pattern_ops twin), then 0007's first operation: both dropped, concurrently."""
    loader = MigrationLoader(connection)
    before = loader.project_state(("orchestration", "0006_startable_tenant"))
    after = loader.project_state(("orchestration", "0007_covered_fk_indexes"))
    operation = loader.get_migration("orchestration", "0007_covered_fk_indexes").operations[0]
    assert (operation.model_name, operation.name) == ("servicecall", "tenant")
    own = {"service_calls_tenant_id_06ffec4d", "service_calls_tenant_id_06ffec4d_like"}
    with connection.schema_editor(atomic=False) as editor:
        operation.database_backwards("orchestration", editor, after, before)
    assert own <= _constraints("service_calls")
    with connection.schema_editor(atomic=False, collect_sql=True) as editor:
        operation.database_forwards("orchestration", editor, before, after)
    assert sorted(editor.collected_sql) == [f'DROP INDEX CONCURRENTLY IF EXISTS "{name}";' for name in sorted(own)]
    with connection.schema_editor(atomic=False) as editor:
        operation.database_forwards("orchestration", editor, before, after)
    assert not own & _constraints("service_calls")
    assert "service_calls_tenant_call" in _constraints("service_calls")


def _constraints(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, table))
