"""History tables partitioned by day on PostgreSQL (docs/schema.md, "History partitioned by
day"): the partitions listed, made ahead and dropped whole. What a query of them reads, the
window of the open rows included, is core/partition_queries.py's.

The append-only history (outbox events, event notifications and their delivery tries, loop runs)
grows by a day's rows every day and goes by whole days. On PostgreSQL such a table is
partitioned by RANGE of its time key: a UUID v7, whose first 48 bits are the milliseconds since
the epoch it was made at (core.ids.new_id), or a time. Each partition holds one UTC day
(`<table>_p20260501`); a table converted while it held rows keeps them in one partition, from
the beginning to the day after its newest row (`<table>_past`); and a DEFAULT partition
(`<table>_default`) takes a row no day's partition covers, so that an insert never fails for a
missing partition. Retention detaches a day's partition and drops it (`drop`) where DELETE went
through it row by row.

SQLite keeps plain tables: where a table is not partitioned every function here does nothing,
lists nothing, or answers None, and the callers keep their plain queries.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, OperationalError, connections, transaction

DAY = timedelta(days=1)
# Days' partitions made ahead of today, by the migration and by every retention run: a day's rows
# never wait in the DEFAULT partition while the retention loop runs at all (hourly).
AHEAD_DAYS = 2
# How long a retention drop waits for its table's lock: every query of the table queues behind
# it meanwhile, so it gives up soon and tries again at the next run.
DROP_LOCK_TIMEOUT = "500ms"
# How long the making of a day's partition waits for its locks.
MAKE_LOCK_TIMEOUT = "5s"


def day_start(at: datetime) -> datetime:
    """The UTC midnight that begins `at`'s day."""
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, at.day, tzinfo=UTC)


@dataclass(frozen=True)
class DailyPartitions:
    """How one table is partitioned: by day of `column`, a UUID v7 (`uuid7`) or a time."""

    table: str
    column: str
    uuid7: bool = True

    def key_at(self, at: datetime) -> uuid.UUID | datetime:
        """The lowest key made at `at` or later: a bound of the partitions' ranges and of the
        queries that name a time (every UUID v7 made before `at` is below it)."""
        if not self.uuid7:
            return at
        return uuid.UUID(int=max(0, int(at.timestamp() * 1000)) << 80)

    def time_of(self, key: uuid.UUID | datetime) -> datetime:
        """When `key` was made (to the millisecond for a UUID v7)."""
        if isinstance(key, datetime):
            return key
        return datetime.fromtimestamp((key.int >> 80) / 1000, tz=UTC)

    def partition_name(self, day: date) -> str:
        return f"{self.table}_p{day:%Y%m%d}"

    @property
    def default_name(self) -> str:
        return f"{self.table}_default"

    @property
    def past_name(self) -> str:
        return f"{self.table}_past"


@dataclass(frozen=True)
class Partition:
    """One partition: its keys from `lower` (None: from the lowest) to `upper` (excluded)."""

    name: str
    lower: datetime | None
    upper: datetime | None
    default: bool = False
    # PostgreSQL's estimate of its rows (pg_class.reltuples; 0 before its first ANALYZE).
    rows: int = 0


def _quote(using: str, name: str) -> str:
    return connections[using].ops.quote_name(name)


# Whether a table is partitioned, by database alias and table; a migration that converts one
# forgets what was known (forget_partitioning).
_PARTITIONED: dict[tuple[str, str], bool] = {}


def is_partitioned(table: str, *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether `table` is partitioned (never on SQLite). Asked of the catalog once per process."""
    known = _PARTITIONED.get((using, table))
    if known is None:
        connection = connections[using]
        known = False
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(%s))",
                    [_quote(using, table)],
                )
                known = bool(cursor.fetchone()[0])
        _PARTITIONED[(using, table)] = known
    return known


def forget_partitioning() -> None:
    _PARTITIONED.clear()


_BOUND = re.compile(r"FOR VALUES FROM \((.+)\) TO \((.+)\)")


def partitions(spec: DailyPartitions, *, using: str = DEFAULT_DB_ALIAS) -> list[Partition]:
    """The table's partitions, oldest first, the DEFAULT one last; none where it is not
    partitioned."""
    if not is_partitioned(spec.table, using=using):
        return []
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), c.reltuples FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [_quote(using, spec.table)],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound, estimate in rows:
        count = max(0, int(estimate))
        if bound == "DEFAULT":
            found.append(Partition(name, None, None, default=True, rows=count))
            continue
        matched = _BOUND.fullmatch(bound)
        if matched is None:
            raise ValueError(f"{name}: a partition bound this module does not make: {bound}")
        lower, upper = (_bound_time(spec, value) for value in matched.groups())
        found.append(Partition(name, lower, upper, rows=count))
    return sorted(found, key=lambda p: (p.default, p.lower or datetime.min.replace(tzinfo=UTC)))


def _bound_time(spec: DailyPartitions, value: str) -> datetime | None:
    if value in ("MINVALUE", "MAXVALUE"):
        return None
    text = value.strip("'")
    if spec.uuid7:
        return spec.time_of(uuid.UUID(text))
    return datetime.fromisoformat(text).astimezone(UTC)


def _overlaps(partition: Partition, lower: datetime, upper: datetime) -> bool:
    if partition.default:
        return False
    return (partition.lower is None or partition.lower < upper) and (partition.upper is None or lower < partition.upper)


def make_days(spec: DailyPartitions, days: Iterable[date], *, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Make the partitions of `days` that no partition covers yet; returns their names. Each in
    a transaction of its own, the clusters taking turns (an advisory lock per table). A new
    partition is made apart and then attached, which holds none of the table's reads or writes
    (CREATE TABLE ... PARTITION OF would lock the whole table), and it takes over the rows of its
    day that waited in the DEFAULT partition."""
    if not is_partitioned(spec.table, using=using):
        return []
    made = []
    for day in sorted(set(days)):
        lower = datetime(day.year, day.month, day.day, tzinfo=UTC)
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{MAKE_LOCK_TIMEOUT}'")
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"partitions:{spec.table}"])
            existing = partitions(spec, using=using)
            if any(_overlaps(p, lower, lower + DAY) for p in existing):
                continue
            _make(cursor, spec, spec.partition_name(day), lower, lower + DAY, existing=existing, using=using)
            made.append(spec.partition_name(day))
    return made


def make_ahead(spec: DailyPartitions, *, now: datetime, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Today's partition and AHEAD_DAYS days' after it, where missing."""
    today = day_start(now).date()
    return make_days(spec, [today + timedelta(days=n) for n in range(AHEAD_DAYS + 1)], using=using)


def _make(
    cursor: Any,
    spec: DailyPartitions,
    name: str,
    lower: datetime,
    upper: datetime,
    *,
    existing: list[Partition],
    using: str,
) -> None:
    q = connections[using].ops.quote_name
    table, column = q(spec.table), q(spec.column)
    cursor.execute(f"CREATE TABLE {q(name)} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    # Every partition holds the table's own unique indexes: those of the DEFAULT one (or the
    # newest), named after the new one.
    default = next((p.name for p in existing if p.default), None)
    template = default or (existing[-1].name if existing else None)
    if template is not None:
        for unique in local_uniques(cursor, template, quote=q):
            cursor.execute(unique.statement(name, q))
    if default is not None:
        columns = ", ".join(q(c) for c in _columns(cursor, spec.table))
        within = f"{column} >= %s AND {column} < %s"
        bounds = [spec.key_at(lower), spec.key_at(upper)]
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM ONLY {q(default)} WHERE {within})", bounds)
        if cursor.fetchone()[0]:
            cursor.execute(
                f"INSERT INTO {q(name)} ({columns}) SELECT {columns} FROM ONLY {q(default)} WHERE {within}", bounds
            )
            cursor.execute(f"DELETE FROM ONLY {q(default)} WHERE {within}", bounds)
    cursor.execute(
        f"ALTER TABLE {table} ATTACH PARTITION {q(name)} FOR VALUES FROM (%s) TO (%s)",
        [spec.key_at(lower), spec.key_at(upper)],
    )


def _columns(cursor: Any, table: str) -> list[str]:
    cursor.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum",
        [f'"{table}"'],
    )
    return [row[0] for row in cursor.fetchall()]


@dataclass(frozen=True)
class LocalUnique:
    """A unique index that one partition has of its own (see `local_uniques`): its name less the
    partition's (or table's) name, and its definition (a constraint's, or the index's from USING)."""

    name: str
    suffix: str
    constraint: bool
    definition: str

    def statement(self, target: str, quote: Any) -> str:
        name = quote(local_name(target, self.suffix))
        if self.constraint:
            return f"ALTER TABLE {quote(target)} ADD CONSTRAINT {name} {self.definition}"
        return f"CREATE UNIQUE INDEX {name} ON {quote(target)}{self.definition}"


def local_uniques(cursor: Any, table: str, *, quote: Any, column: str | None = None) -> list[LocalUnique]:
    """The unique indexes of `table` (a partition, or a plain table about to become one) that a
    partitioned parent cannot hold: those not attached to an index of a parent, and, with
    `column` (the partition key), those whose columns leave it out. PostgreSQL enforces a unique
    index made on a partitioned table only if it holds the partition key; the others (the
    outbox's `id`, a feed number per tenant) are made on each partition."""
    cursor.execute(
        "SELECT i.relname, con.contype, pg_get_constraintdef(con.oid), pg_get_indexdef(x.indexrelid), "
        "(SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = x.indrelid "
        "AND a.attnum = ANY (x.indkey)) "
        "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "LEFT JOIN pg_constraint con ON con.conindid = x.indexrelid AND con.conrelid = x.indrelid "
        "WHERE x.indrelid = to_regclass(%s) AND x.indisunique "
        "AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = x.indexrelid) ORDER BY i.relname",
        [quote(table)],
    )
    return [
        LocalUnique(
            name=name,
            suffix=name.removeprefix(f"{table}_"),
            constraint=kind in ("p", "u"),
            definition=constraint if kind in ("p", "u") else definition[definition.index(" USING ") :],
        )
        for name, kind, constraint, definition, columns in cursor.fetchall()
        if column is None or column not in (columns or [])
    ]


def local_name(partition: str, suffix: str) -> str:
    """The name of a partition's own index: `<partition>_<suffix>`, cut to PostgreSQL's 63 bytes."""
    return f"{partition}_{suffix}"[:63]


def drop(
    spec: DailyPartitions,
    partition: Partition,
    *,
    unless: str | None = None,
    with_: Sequence[tuple[DailyPartitions, Partition]] = (),
    using: str = DEFAULT_DB_ALIAS,
) -> bool:
    """Drop `partition` of `spec`'s table (with the partitions `with_` of other tables, whose
    rows reference its rows), unless a row of it meets `unless` (SQL on the partition, aliased
    `p`). Returns whether it went.

    Two steps, so that no query of the history waits while the day's files are freed (gigabytes
    at ten million calls a day, which the filesystem takes a second or more over):
    1. In one transaction the tables are locked (ACCESS EXCLUSIVE, which detaching takes
       anyway), `unless` is checked, which no row can now escape, and the partitions are
       detached, the referencing ones first, each losing its foreign keys to the tables being
       detached from (detaching a referenced partition checks that no attached row refers to
       it). Every query of the tables waits for this transaction, a few milliseconds: the lock
       is waited for DROP_LOCK_TIMEOUT at most, then the day waits for the next run.
    2. Each detached table, renamed `<partition>_detached`, is dropped by `drop_detached`, which
       the caller runs after its days, outside any write gate: in transactions of their own that
       lock nothing a query of the history reads. A crash in between leaves it to the next run.

    The tables the parents' foreign keys refer to (subscriptions, worker sessions) are locked
    first, SHARE ROW EXCLUSIVE as the detach takes them to make its triggers, so that a wait for
    them happens before any query of the history queues behind the parents' lock."""
    q = connections[using].ops.quote_name
    both = [(spec, partition), *with_]
    parents = [each.table for each, _ in both]
    try:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
            # A caller's own writes still to be checked (deferred foreign keys) would forbid the drop.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            for table in _referenced(cursor, parents):
                cursor.execute(f"LOCK TABLE ONLY {q(table)} IN SHARE ROW EXCLUSIVE MODE")
            for table in parents:
                cursor.execute(f"LOCK TABLE ONLY {q(table)} IN ACCESS EXCLUSIVE MODE")
            if unless is not None:
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM ONLY {q(partition.name)} p WHERE {unless})")
                if cursor.fetchone()[0]:
                    return False
            for each_spec, each in reversed(both):
                cursor.execute(f"ALTER TABLE {q(each_spec.table)} DETACH PARTITION {q(each.name)}")
                _drop_foreign_keys(cursor, each.name, only_to=parents, quote=q)
                cursor.execute(f"ALTER TABLE {q(each.name)} RENAME TO {q(_detached_name(each.name))}")
    except OperationalError as exc:
        if _lock_not_available(exc):
            return False
        raise
    return True


def _referenced(cursor: Any, parents: Sequence[str]) -> list[str]:
    """The tables other than `parents` that their foreign keys refer to, by name."""
    cursor.execute(
        "SELECT DISTINCT ref.relname FROM pg_constraint con JOIN pg_class ref ON ref.oid = con.confrelid "
        "WHERE con.contype = 'f' AND con.conrelid = ANY (SELECT to_regclass(name) FROM unnest(%s::text[]) AS name) "
        "ORDER BY 1",
        [list(parents)],
    )
    return [name for (name,) in cursor.fetchall() if name not in parents]


def drop_detached(spec: DailyPartitions, *, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Drop the day partitions of `spec`'s table that `drop` detached (those of a run that ended
    between its two steps too); returns their names. Each loses its remaining foreign keys in a
    transaction of its own (dropping one locks the table it refers to, for milliseconds) and then
    goes, its files freed while only it is locked. One it cannot have now is left for the next
    run."""
    if not is_partitioned(spec.table, using=using):
        return []
    q = connections[using].ops.quote_name
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND NOT relispartition "
            "AND relnamespace = current_schema()::regnamespace AND relname ~ %s ORDER BY relname",
            [f"^{re.escape(spec.table)}_(p[0-9]{{8}}|past){_DETACHED}$"],
        )
        names = [row[0] for row in cursor.fetchall()]
    dropped = []
    for name in names:
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
                _drop_foreign_keys(cursor, name, quote=q)
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
                cursor.execute(f"DROP TABLE IF EXISTS {q(name)}")  # another cluster's run may be first
        except OperationalError as exc:
            if _lock_not_available(exc):
                continue
            raise
        dropped.append(name)
    return dropped


_DETACHED = "_detached"


def _detached_name(partition: str) -> str:
    return f"{partition}{_DETACHED}"


def _drop_foreign_keys(cursor: Any, table: str, *, quote: Any, only_to: Sequence[str] | None = None) -> None:
    """Drop `table`'s own foreign keys (those to the tables `only_to`, if given). A detached
    partition keeps the foreign keys it had through its parent, as constraints of its own."""
    cursor.execute(
        "SELECT con.conname, ref.relname FROM pg_constraint con JOIN pg_class ref ON ref.oid = con.confrelid "
        "WHERE con.conrelid = to_regclass(%s) AND con.contype = 'f' AND con.conparentid = 0 ORDER BY con.conname",
        [quote(table)],
    )
    for name, referenced in cursor.fetchall():
        if only_to is None or referenced in only_to:
            cursor.execute(f"ALTER TABLE {quote(table)} DROP CONSTRAINT {quote(name)}")


def _lock_not_available(exc: OperationalError) -> bool:
    # 55P03, lock_not_available: the lock was not had within the lock_timeout.
    return getattr(exc.__cause__, "sqlstate", None) == "55P03"


def drop_past_days(
    spec: DailyPartitions,
    *,
    before: datetime,
    drop_day: Callable[[Partition], bool],
    write_guard: Callable[[], AbstractContextManager[None]] = nullcontext,
    using: str = DEFAULT_DB_ALIAS,
) -> tuple[int, list[tuple[Any, Any]]]:
    """Retention by whole days: each day's partition of `spec` that ends by `before`, oldest first,
    is offered to `drop_day` (under `write_guard`), which drops it or says why not (a row still
    needed). Returns the rows dropped (PostgreSQL's estimate) and the key ranges left for the
    caller to delete row by row, `(lower, upper)` with None for open: what no day's partition
    holds below the first day (a converted table's past), and each day kept. Unpartitioned, the
    whole table is left: `(None, None)`."""
    if not is_partitioned(spec.table, using=using):
        return 0, [(None, None)]
    drop_detached(spec, using=using)  # a crashed run's
    try:
        return _drop_past_days(spec, before=before, drop_day=drop_day, write_guard=write_guard, using=using)
    finally:
        drop_detached(spec, using=using)  # the days detached now: outside the write guard


def _drop_past_days(
    spec: DailyPartitions,
    *,
    before: datetime,
    drop_day: Callable[[Partition], bool],
    write_guard: Callable[[], AbstractContextManager[None]],
    using: str,
) -> tuple[int, list[tuple[Any, Any]]]:
    dropped = 0
    days = [p for p in partitions(spec, using=using) if not p.default and p.lower is not None]
    kept = [(None, days[0].lower if days else None)]
    for day in days:
        if day.upper is None or day.upper > before:
            break  # not yet wholly past `before`: the next run's
        with write_guard():
            gone = drop_day(day)
        if gone:
            dropped += day.rows
        else:
            kept.append((day.lower, day.upper))
    keys = [
        (None if lower is None else spec.key_at(lower), None if upper is None else spec.key_at(upper))
        for lower, upper in kept
    ]
    return dropped, keys


def partition_of(partition: Partition, other: DailyPartitions, *, using: str = DEFAULT_DB_ALIAS) -> Partition | None:
    """`other`'s partition with the same range as `partition` (its rows' rows), if any."""
    return next(
        (
            p
            for p in partitions(other, using=using)
            if not p.default and p.lower == partition.lower and p.upper == partition.upper
        ),
        None,
    )
