"""A batched UPDATE for hot paths: one prepared statement, many rows (executemany).

The ORM compiles one UPDATE per row (or a CASE per field per row with bulk_update), which
costs more CPU than the database work when a worker records a hundred outcomes at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Model


def update_many(
    model: type[Model],
    *,
    set_fields: Sequence[str],
    where_fields: Sequence[str],
    rows: Sequence[Sequence[Any]],
    where_extra: dict[str, Any] | None = None,
) -> None:
    """UPDATE model SET set_fields WHERE where_fields (= each row's trailing values) [AND where_extra].

    Each row holds the values of set_fields then where_fields, as Python values; they are
    prepared by the model's fields, as the ORM would.
    """
    if not rows:
        return
    meta = model._meta
    fields = [meta.get_field(name) for name in (*set_fields, *where_fields)]
    quote = connection.ops.quote_name
    extra = where_extra or {}
    extra_fields = [meta.get_field(name) for name in extra]
    sql = (
        f"UPDATE {quote(meta.db_table)} SET "
        + ", ".join(f"{quote(f.column)} = %s" for f in fields[: len(set_fields)])
        + " WHERE "
        + " AND ".join(f"{quote(f.column)} = %s" for f in [*fields[len(set_fields) :], *extra_fields])
    )
    extra_values = [f.get_db_prep_save(v, connection) for f, v in zip(extra_fields, extra.values(), strict=True)]
    params = [
        [f.get_db_prep_save(v, connection) for f, v in zip(fields, row, strict=True)] + extra_values for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
