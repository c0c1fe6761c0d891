"""Copy a stopped agent's data into an empty PostgreSQL database (docs/deploy.md, "Moving from
SQLite to PostgreSQL"): `manage.py copy_to_postgres`.

Every row of the product's tables (tenants, users, memberships, API keys, calls with their tags,
attempts and events, timers, schedules, subscriptions with their sealed secrets, notifications
and their tries, worker records, the admin's history) goes across as it is stored: sealed
secrets stay sealed (the target agent needs the same SECRET_KEY or FIELD_ENCRYPTION_KEYS), ids
and times are kept. What the target's own `migrate` makes (content types, permissions) is not
copied; the rows that point at them are mapped by their natural keys. Not copied: sessions
(everyone logs in again), django-q2's queue (a due call's timer starts it anyway) and the login
lockout records.

In one transaction on the target: a failure leaves it as empty as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.management.color import no_style
from django.db import connections, models, transaction
from django.db.models import Max, Min
from django.utils import timezone

from core.partitions import make_days
from eventservice.database import parse_database_url

TARGET = "copy_target"
# Apps whose rows are not the agent's to move (see the module's docstring).
LEFT_OUT_APPS = frozenset({"contenttypes", "sessions", "django_q", "axes"})
ROWS_PER_BATCH = 2000


class CopyRefused(Exception):
    """The copy cannot start; nothing was written."""


@dataclass(frozen=True)
class Copied:
    table: str
    rows: int
    # Grants of permissions the target's version no longer has, left behind.
    left: int = 0


def target_alias(url: str) -> str:
    """A database alias for `url` (a PostgreSQL URL), made for this process."""
    try:
        config = parse_database_url(url)
    except ValueError:
        raise CopyRefused(f"not a database URL: {url!r}") from None
    if config.get("ENGINE") != "django.db.backends.postgresql":
        raise CopyRefused(f"the target must be a PostgreSQL URL (postgres://user:password@host:5432/db), got {url!r}")
    both = connections.configure_settings({"default": dict(connections.databases["default"]), TARGET: config})
    connections.databases[TARGET] = both[TARGET]
    return TARGET


def models_to_copy() -> list[type[models.Model]]:
    """The product's models, each after the models its foreign keys point to."""
    wanted = [
        model
        for model in apps.get_models(include_auto_created=True)
        if model._meta.app_label not in LEFT_OUT_APPS
        and model._meta.managed
        and not model._meta.proxy
        and model is not apps.get_model("auth", "Permission")
    ]
    ordered: list[type[models.Model]] = []
    placed: set[type[models.Model]] = set()

    def place(model: type[models.Model], path: tuple = ()) -> None:
        if model in placed:
            return
        if model in path:
            raise RuntimeError(f"foreign keys form a cycle through {model._meta.label}")
        for field in model._meta.concrete_fields:
            target = field.related_model if field.is_relation else None
            if target is not None and target is not model and target in wanted:
                place(target, (*path, model))
        placed.add(model)
        ordered.append(model)

    for model in wanted:
        place(model)
    return ordered


def refuse_a_running_agent() -> None:
    """The copy is of a stopped agent: rows written during it would be missed."""
    from workers.models import WorkerSession

    recent = timezone.now() - timedelta(seconds=settings.WORKER_STALE_SECONDS)
    running = WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING, last_heartbeat_at__gte=recent)
    if running.exists():
        hosts = sorted({f"{host} (pid {pid})" for host, pid in running.values_list("hostname", "pid")})
        raise CopyRefused(f"the agent is running (workers beating on {', '.join(hosts)}): stop it first")


def refuse_a_non_empty_target(alias: str, copied: list[type[models.Model]]) -> None:
    for model in copied:
        if model._base_manager.using(alias).exists():
            raise CopyRefused(
                f"the target database is not empty: {model._meta.db_table} has rows "
                "(copy only into a new, empty database)"
            )


def copy_all(url: str, *, progress: Callable[[Copied], None] = lambda copied: None) -> list[Copied]:
    """Migrate the target at `url`, then copy every table in one transaction on it; checks each
    table's count afterwards. Raises CopyRefused before writing anything it refuses."""
    alias = target_alias(url)
    refuse_a_running_agent()
    _migrate(url)
    tables = models_to_copy()
    refuse_a_non_empty_target(alias, tables)
    remap = _natural_key_maps(alias)
    done = []
    with transaction.atomic(using=alias):
        _history_days(alias)
        for model in tables:
            rows, left = _copy_table(model, alias, remap)
            done.append(Copied(model._meta.db_table, rows, left))
            progress(done[-1])
        with connections[alias].cursor() as cursor:
            for statement in connections[alias].ops.sequence_reset_sql(no_style(), tables):
                cursor.execute(statement)
        for model, copied in zip(tables, done, strict=True):
            source = model._base_manager.using("default").count()
            found = model._base_manager.using(alias).count()
            if found != copied.rows or source != copied.rows + copied.left:
                raise RuntimeError(f"{copied.table}: {source} rows in the source, {found} in the target")
    return done


def _migrate(url: str) -> None:
    """`manage.py migrate` of the target, as the agent on it will run it: a process of its own
    whose default database is the target (migrations read the default database's vendor,
    core.schema.AtomicElsewhere)."""
    env = {**os.environ, "DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "migrate", "--no-input", "-v0"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise CopyRefused(f"migrating the target failed: {(done.stderr or done.stdout).strip()[-2000:]}")


def _history_days(alias: str) -> None:
    """Where the target's history is partitioned by day (docs/schema.md, "History partitioned by
    day"), the partitions of the days the source's rows were made on: without them every copied
    row would wait in the DEFAULT partition, which retention goes through only row by row."""
    from delivery.models import DeliveryAttempt, Notification
    from delivery.partitions import ATTEMPT_DAYS, NOTIFICATION_DAYS
    from outbox.models import OutboxEvent
    from outbox.partitions import OUTBOX_DAYS
    from workers.models import LoopRun
    from workers.services import RUN_DAYS

    for model, spec in (
        (OutboxEvent, OUTBOX_DAYS),
        (Notification, NOTIFICATION_DAYS),
        (DeliveryAttempt, ATTEMPT_DAYS),
        (LoopRun, RUN_DAYS),
    ):
        span = model._base_manager.using("default").aggregate(low=Min(spec.column), high=Max(spec.column))
        if span["low"] is None:
            continue
        first, last = (spec.time_of(span[end]).date() for end in ("low", "high"))
        make_days(spec, [first + timedelta(days=n) for n in range((last - first).days + 1)], using=alias)


def _natural_key_maps(alias: str) -> dict[type[models.Model], dict[Any, Any]]:
    """Source id -> target id of the content types and permissions, which each database's
    migrate made in its own order."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    target_types = {(ct.app_label, ct.model): ct.pk for ct in ContentType.objects.using(alias)}
    types = {ct.pk: target_types.get((ct.app_label, ct.model)) for ct in ContentType.objects.using("default")}
    target_permissions = {(perm.content_type_id, perm.codename): perm.pk for perm in Permission.objects.using(alias)}
    permissions = {
        perm.pk: target_permissions.get((types.get(perm.content_type_id), perm.codename))
        for perm in Permission.objects.using("default")
    }
    return {ContentType: types, Permission: permissions}


def _copy_table(model: type[models.Model], alias: str, remap: dict) -> tuple[int, int]:
    """Rows copied, and rows left behind (see Copied.left)."""
    fields = model._meta.concrete_fields
    connection = connections[alias]
    quote = connection.ops.quote_name
    sql = "INSERT INTO {} ({}) VALUES ({})".format(
        quote(model._meta.db_table),
        ", ".join(quote(field.column) for field in fields),
        ", ".join(["%s"] * len(fields)),
    )
    maps = [remap.get(field.related_model) if field.is_relation else None for field in fields]
    count = left = 0
    with connection.cursor() as cursor:
        for batch in _batches(model, [field.attname for field in fields]):
            rows = []
            for values in batch:
                row = []
                for field, mapping, value in zip(fields, maps, values, strict=True):
                    if mapping is not None and value is not None:
                        value = mapping.get(value)
                    # As the ORM writes it (UUIDs, JSON, times), never through pre_save: kept as stored.
                    row.append(field.get_db_prep_save(value, connection=connection))
                if model._meta.auto_created and any(
                    mapping is not None and value is None for mapping, value in zip(maps, row, strict=True)
                ):
                    left += 1  # a permission the target's version no longer has: its grant goes
                    continue
                rows.append(row)
            cursor.executemany(sql, rows)
            count += len(rows)
    return count, left


def _batches(model: type[models.Model], attnames: list[str]) -> Iterator[list[tuple]]:
    batch = []
    for values in (
        model._base_manager.using("default").order_by("pk").values_list(*attnames).iterator(chunk_size=ROWS_PER_BATCH)
    ):
        batch.append(values)
        if len(batch) == ROWS_PER_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
