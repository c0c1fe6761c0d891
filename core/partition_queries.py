"""What a query of a table partitioned by day reads (docs/schema.md, "History partitioned by
day"): the window of its open rows, the key ranges of a time, and the bounds the loops' and the
pages' queries add so that PostgreSQL plans and reads only the partitions they need. The
partitions themselves (listed, made, dropped) are core/partitions.py's.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Q

from core.db.wakeups import Channel, wakeups
from core.partitions import DAY, DailyPartitions, day_start, is_partitioned, partitions


def key_range(field: str, lower: Any, upper: Any) -> Q:
    """A filter on `field` from `lower` (included) to `upper` (excluded), None for open: a key
    range of `drop_past_days`."""
    condition = Q()
    if lower is not None:
        condition &= Q(**{f"{field}__gte": lower})
    if upper is not None:
        condition &= Q(**{f"{field}__lt": upper})
    return condition


# How far ahead of this host's clock the loops look for open rows (core.ids.new_id runs ahead of
# the clock by a millisecond per id beyond a thousand a second in one process: seconds in a burst).
WINDOW_AHEAD = timedelta(hours=1)
# While the wake-ups listen and nothing opened a row, how long an open window's floor is kept.
QUIET_TTL = 60.0


class OpenWindow:
    """The range of keys that a table's open rows (unpublished events, notifications with a next
    try) can have, for the loops' queries of them, which then plan and read only the partitions
    in it rather than every partition retention keeps: yesterday's and today's.

    From the day of the oldest open row (yesterday's start, when every open row is younger) to
    an hour ahead of now (new rows are made with keys of now). The oldest is looked for at most
    every `ttl` seconds per process, one index probe of each older partition's partial index,
    so a row opened meanwhile below the window (an operator's resend of an old notification, an
    event published more than a day late) is found within `ttl` seconds (the fan-out makes such
    a late event's notifications due only after that: delivery.services.fanout); a row whose key
    is more than WINDOW_AHEAD ahead of this host's clock waits until the window reaches it.
    `bounds` is None where the table is not partitioned: the queries stay as they are.

    With `channel`, while the wake-ups listen (core/db/wakeups.py), the oldest is looked for again
    only once the channel has woken since the last look (every commit that opens a row notifies
    it), or after QUIET_TTL: an idle agent does not list the partitions every second."""

    def __init__(
        self, spec: DailyPartitions, open_rows: str, *, ttl: float = 1.0, channel: Channel | None = None
    ) -> None:
        self.spec, self.open_rows, self.ttl, self.channel = spec, open_rows, ttl, channel
        # By database alias: when the floor was looked for, the channel's wakes then, the floor.
        self._floors: dict[str, tuple[float, int | None, Any]] = {}
        self._lock = threading.Lock()

    def bounds(self, *, now: datetime, using: str = DEFAULT_DB_ALIAS) -> tuple[Any, Any] | None:
        if not is_partitioned(self.spec.table, using=using):
            return None
        upper = self.spec.key_at(now + WINDOW_AHEAD)
        wakes = wakeups.generation(self.channel) if self.channel is not None else None
        with self._lock:
            cached = self._floors.get(using)
        if cached is None or self._stale(cached, wakes):
            cached = (time.monotonic(), wakes, open_floor(self.spec, self.open_rows, now=now, using=using))
            with self._lock:
                self._floors[using] = cached
        return cached[2], upper

    def _stale(self, cached: tuple[float, int | None, Any], wakes: int | None) -> bool:
        age = time.monotonic() - cached[0]
        if age < self.ttl:
            return False
        # Not listening (None): every `ttl`; listening, once the channel woke, or QUIET_TTL.
        return wakes is None or wakes != cached[1] or age >= QUIET_TTL

    def forget(self) -> None:
        with self._lock:
            self._floors.clear()


def open_floor(spec: DailyPartitions, open_rows: str, *, now: datetime, using: str = DEFAULT_DB_ALIAS) -> Any:
    """The start of the day of the lowest key an open row (`open_rows`, SQL on the table) has now,
    or of yesterday where every open row is younger: one probe of the partial index of each
    partition holding older keys (those retention keeps, a converted table's past, the DEFAULT
    partition). A day's start, so that the bound takes in each partition of the window whole:
    a query's planner then sees nothing to gain from the key's own index, and keeps to the
    partial index of the open rows."""
    q = connections[using].ops.quote_name
    cap = spec.key_at(day_start(now) - DAY)
    older = [p for p in partitions(spec, using=using) if p.default or p.lower is None or spec.key_at(p.lower) < cap]
    if not older:
        return cap
    column = q(spec.column)
    # min() of the text of a UUID (PostgreSQL 15 has none of a UUID; the text sorts alike): an
    # aggregate, so each probe reads the partial index of the open rows, never the key's index.
    lowest_key = f"min({column}::text)" if spec.uuid7 else f"min({column})"
    probes = " UNION ALL ".join(
        f"SELECT {lowest_key} AS k FROM ONLY {q(p.name)} WHERE {open_rows} AND {column} < %s" for p in older
    )
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT min(k) FROM ({probes}) AS probes", [cap] * len(older))
        lowest = cursor.fetchone()[0]
    if lowest is None:
        return cap
    made = spec.time_of(uuid.UUID(lowest) if spec.uuid7 else lowest)
    return min(spec.key_at(day_start(made)), cap)


def within(bounds: tuple[Any, Any] | None, column: str) -> tuple[str, list[Any]]:
    """`bounds` (an OpenWindow's) as SQL to add to a query's WHERE, ` AND <column> >= %s AND
    <column> < %s`, and its two values; nothing without bounds."""
    if bounds is None:
        return "", []
    return f" AND {column} >= %s AND {column} < %s", list(bounds)


# How far a row's key may be older than the key of the row it follows from (a call's events and
# notifications, dated by other hosts' clocks than the call's id): the bound of `made_since`.
CLOCK_MARGIN = timedelta(hours=1)


def made_since(spec: DailyPartitions, origin: uuid.UUID | str, *, using: str = DEFAULT_DB_ALIAS) -> Any:
    """Where `spec`'s table is partitioned, the lowest key of a row made after `origin` (a UUID
    v7: a call's id), less CLOCK_MARGIN: a bound that keeps a query of the rows that follow from
    it (a call's events, its notifications) to the partitions from its day on. None elsewhere,
    or for an id that is no UUID v7."""
    if not is_partitioned(spec.table, using=using):
        return None
    try:
        key = origin if isinstance(origin, uuid.UUID) else uuid.UUID(str(origin))
    except ValueError:
        return None
    if key.version != 7:
        return None
    return spec.key_at(spec.time_of(key) - CLOCK_MARGIN)
