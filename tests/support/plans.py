"""The SQL the product really runs, recorded, and its query plan (SQLite's EXPLAIN QUERY PLAN).

Plan tests record the queries of the product's own code (a selector, a view) instead of
rebuilding them, so a change to the product's query changes what is explained.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import connection

Query = tuple[str, Sequence[Any]]


@contextmanager
def recorded_queries() -> Iterator[list[Query]]:
    """(sql, params) of every statement run on the default connection inside the block, as the
    ORM hands them to the driver."""
    queries: list[Query] = []

    def record(execute, sql, params, many, context):
        if not many:
            queries.append((sql, tuple(params or ())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield queries


def selects_from(queries: list[Query], table: str) -> list[Query]:
    """The SELECTs among `queries` whose FROM names `table`."""
    return [(sql, params) for sql, params in queries if sql.startswith("SELECT") and f'FROM "{table}"' in sql]


def query_plan(sql: str, params: Sequence[Any]) -> list[str]:
    """The detail column of each EXPLAIN QUERY PLAN row (SQLite)."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        return [row[-1] for row in cursor.fetchall()]
