"""core/schema.py: an index that a migration adds on a live table does not stop its writes on
PostgreSQL (CREATE INDEX CONCURRENTLY), and is a plain index elsewhere (docs/deploy.md,
"Upgrades")."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from io import StringIO
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.core.management import call_command
from django.db import NotSupportedError, connection, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations import AddConstraint, AddField, AddIndex, AlterField, CreateModel
from django.db.migrations.state import ProjectState
from django.db.models import F, UniqueConstraint

from core.schema import AddIndexConcurrently, AtomicElsewhere
from delivery.models import Notification
from delivery.services import subscription_create, subscription_send_test
from delivery.validation import SubscriptionInput
from tests.support.agent_process import ROOT, agent_env, manage
from tests.support.waiting import wait_for

NAME = "event_notifications_claimed"


def _operation() -> AddIndexConcurrently:
    index = next(index for index in Notification._meta.indexes if index.name == NAME)
    return AddIndexConcurrently(model_name="notification", index=index)


def _build() -> None:
    state = ProjectState.from_apps(Notification._meta.apps)
    with connection.schema_editor(atomic=False) as editor:
        _operation().database_forwards("delivery", editor, state, state)


@contextmanager
def _index_dropped():
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {NAME}")
    try:
        yield
    finally:  # the schema as the migrations left it, for the tests after this one
        if NAME not in _indexes():
            _build()


def _partitions() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'event_notifications'::regclass ORDER BY 1"
        )
        return [row[0] for row in cursor.fetchall()]


def _indexes() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, Notification._meta.db_table))


def _notifications(n: int) -> list[Notification]:
    hook = subscription_create(tenant_id="acme", data=SubscriptionInput(kind="webhook", name="h", url="http://x/"))[0]
    return [subscription_send_test(tenant_id="acme", subscription_id=hook.pk) for _ in range(n)]


def _touch(notification: Notification) -> None:
    Notification.objects.filter(pk=notification.pk).update(next_attempt_at=F("next_attempt_at"))


@pytest.mark.django_db(transaction=True)
def test_elsewhere_the_index_is_a_plain_one_built_at_once(world):
    if connection.vendor == "postgresql":
        pytest.skip("SQLite's build: PostgreSQL's is the test below")
    _notifications(2)
    with _index_dropped():
        assert NAME not in _indexes()
        _build()
        assert NAME in _indexes()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sqlmigrate_shows_the_claims_index_built_concurrently_on_postgresql():
    """The notifications are partitioned (docs/schema.md, "History partitioned by day"): each
    partition's index is built concurrently, then the table's made on it alone."""
    out = StringIO()
    call_command("sqlmigrate", "delivery", "0003_claimed_by", stdout=out)
    shown = out.getvalue()
    partitions = _partitions()
    assert partitions
    for partition in partitions:
        assert f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{partition}_claimed" ON "{partition}"' in shown
    assert f'CREATE INDEX IF NOT EXISTS "{NAME}" ON ONLY "event_notifications"' in shown


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sqlmigrate_backwards_drops_it_plainly_on_the_partitioned_table():
    """PostgreSQL drops no index of a partitioned table concurrently: a plain DROP, a catalog
    change (core/schema.py)."""
    out = StringIO()
    call_command("sqlmigrate", "delivery", "0003_claimed_by", backwards=True, stdout=out)
    assert f'DROP INDEX IF EXISTS "{NAME}"' in out.getvalue()


def test_elsewhere_the_migration_goes_back_and_forth(tmp_path):
    """On a fresh SQLite database: 0003 undone (its index, then its column) and done again."""
    env = agent_env(tmp_path, SECRET_KEY="k" * 50)
    for target, left in (("0003", ["claimed_by", NAME]), ("0002", []), ("0003", ["claimed_by", NAME])):
        result = manage(env, "migrate", "delivery", target)
        assert result.returncode == 0, result.stderr
        shown = manage(env, "shell", "--no-imports", "-c", SHOW_COLUMN_AND_INDEX)
        assert shown.stdout.split() == left, shown.stderr


SHOW_COLUMN_AND_INDEX = f"""
from django.db import connection
with connection.cursor() as cursor:
    names = [c.name for c in connection.introspection.get_table_description(cursor, "event_notifications")]
    constraints = connection.introspection.get_constraints(cursor, "event_notifications")
print(*[name for name in names if name == "claimed_by"], *[name for name in constraints if name == "{NAME}"])
"""


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_writes_go_on_while_the_index_waits_for_an_open_transaction(world):
    """A transaction that wrote to the table stays open while the index is to be built: the
    build waits for it, and another write goes through meanwhile (a plain CREATE INDEX would
    queue its lock ahead of that write, which would then wait for the whole build)."""
    held, other = _notifications(2)
    with _index_dropped():
        holding, release, built = threading.Event(), threading.Event(), threading.Event()
        errors: list[BaseException] = []

        def hold() -> None:
            try:
                with transaction.atomic():
                    _touch(held)
                    holding.set()
                    release.wait(20)
            finally:
                connection.close()

        def build() -> None:
            try:
                _build()
            except BaseException as exc:
                errors.append(exc)
            finally:
                built.set()
                connection.close()

        holder, builder = threading.Thread(target=hold), threading.Thread(target=build)
        holder.start()
        try:
            assert holding.wait(10)
            builder.start()

            def build_waits() -> bool:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX%%' "
                        "AND wait_event_type = 'Lock' AND datname = current_database()"
                    )
                    return cursor.fetchone()[0] == 1

            wait_for(build_waits, timeout=10)
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '2s'")
                _touch(other)  # a plain CREATE INDEX: "canceling statement due to lock timeout"
            assert not built.is_set()
        finally:
            release.set()
            holder.join(10)
            if builder.is_alive() or built.is_set():
                builder.join(20)
        assert not errors, errors
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
                [NAME],
            )
            assert cursor.fetchall() == [(True,)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_build_inside_a_transaction_is_refused_before_it_starts(world):
    with _index_dropped():
        state = ProjectState.from_apps(Notification._meta.apps)
        with (
            pytest.raises(NotSupportedError, match="set atomic = core.schema.AtomicElsewhere"),
            connection.schema_editor(atomic=True) as editor,
        ):
            _operation().database_forwards("delivery", editor, state, state)
        assert NAME not in _indexes()


# Built an index plainly before core/schema.py existed (docs/deploy.md, "Upgrades").
PLAIN_BEFORE = {
    ("delivery", "0002_claim_order_index"),
    ("orchestration", "0002_cancel_and_retries"),
    ("orchestration", "0003_schedule_occurrence"),  # a unique constraint
    ("orchestration", "0004_flow_control"),
    ("orchestration", "0005_startable_due"),
    ("orchestration", "0006_startable_tenant"),
    ("outbox", "0002_feed_seq"),  # a unique constraint
}
# Adds a column, then builds its index concurrently: interrupted on PostgreSQL, it leaves the
# column (docs/deploy.md says how to recover).
SHARED_BEFORE = {("delivery", "0003_claimed_by")}


def _builds_an_index(operation: object) -> bool:
    """An operation that builds an index on an existing table with a plain CREATE INDEX (or a
    unique constraint, which is one)."""
    if isinstance(operation, AddIndexConcurrently):
        return False
    if isinstance(operation, AddIndex):
        return True
    if isinstance(operation, AddField | AlterField):
        return bool(operation.field.db_index or operation.field.unique)
    return isinstance(operation, AddConstraint) and isinstance(operation.constraint, UniqueConstraint)


def test_a_new_migration_adds_its_indexes_concurrently_each_in_a_migration_of_its_own():
    """An index on an existing table (an index, an indexed or unique field, a unique
    constraint) is added with core.schema.AddIndexConcurrently, alone in a migration whose
    `atomic` is core.schema.AtomicElsewhere (interrupted, it leaves nothing but the index,
    which docs/deploy.md says to drop); the indexes of a table made in the same migration are
    not (nothing writes to it yet). A unique constraint has no concurrent build here: a
    migration that needs one goes into PLAIN_BEFORE with its reason, and the guide's advice
    for those (a quiet hour) applies to it."""
    ours = {app.label for app in django_apps.get_app_configs() if Path(app.path).parent == ROOT}
    plain, atomic, shared = set(), set(), set()
    for key, migration in MigrationLoader(None, ignore_no_migrations=True).disk_migrations.items():
        if key[0] not in ours:
            continue
        made = {operation.name_lower for operation in migration.operations if isinstance(operation, CreateModel)}
        for operation in migration.operations:
            if isinstance(operation, AddIndexConcurrently):
                if not isinstance(type(migration).__dict__.get("atomic"), AtomicElsewhere):
                    atomic.add(key)
                if len(migration.operations) > 1:
                    shared.add(key)
            elif _builds_an_index(operation) and operation.model_name_lower not in made:
                plain.add(key)
    assert plain <= PLAIN_BEFORE, sorted(plain - PLAIN_BEFORE)
    assert not atomic, sorted(atomic)
    assert shared <= SHARED_BEFORE, sorted(shared - SHARED_BEFORE)


@pytest.mark.also_postgres
def test_the_migration_is_one_transaction_except_on_postgresql():
    """SQLite adds the column and its index in one transaction: a migration cut off there
    (the write lock not had within its timeout) leaves nothing half done."""
    migration = MigrationLoader(None, ignore_no_migrations=True).disk_migrations[("delivery", "0003_claimed_by")]
    assert migration.atomic is (connection.vendor != "postgresql")
