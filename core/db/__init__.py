"""Database helpers for hot paths, by concern:

- transactions: turns across processes (take_turn), the timer's writes first (urgent_writes),
  one process's concurrent writes sharing a transaction (group_commit);
- statements: reads and writes written once per process (sql_query, sql_update_returning,
  sql_execute_many, rows_by_key) and how their values are passed and read back;
- watch: a loop's idle poll skipped while nothing was committed (ChangeWatch), and its sleep;
- wakeups: the channels that wake the loops (notify, wakeups);
- values: a field's value prepared as the ORM prepares it, cheaper (saver);
- bulk: batched UPDATEs and INSERTs (update_many, insert_prepare, insert_new, insert_many);
- pool: each process's connection pool on PostgreSQL (pool_install, pool_options,
  pool_release, pool_resize, is_pool_timeout).

Import from `core.db`: the names below are its public ones.
"""

from core.db.bulk import (
    INSERT_MAX_ROWS,
    PreparedInsert,
    insert_many,
    insert_new,
    insert_prepare,
    insert_rows_prepare,
    rows_per_insert,
    update_many,
)
from core.db.pool import is_pool_timeout, pool_install, pool_options, pool_release, pool_resize
from core.db.statements import (
    db_datetime,
    db_param,
    db_uuid,
    rows_by_key,
    sql_execute_many,
    sql_query,
    sql_update_returning,
)
from core.db.transactions import (
    GROUP_COMMIT_MAX,
    group_commit,
    one_transaction,
    take_turn,
    urgent_writes,
    writes_urgent,
)
from core.db.values import Saver, saver
from core.db.watch import ChangeWatch

__all__ = [
    "GROUP_COMMIT_MAX",
    "INSERT_MAX_ROWS",
    "ChangeWatch",
    "PreparedInsert",
    "Saver",
    "db_datetime",
    "db_param",
    "db_uuid",
    "group_commit",
    "insert_many",
    "insert_new",
    "insert_prepare",
    "insert_rows_prepare",
    "is_pool_timeout",
    "one_transaction",
    "pool_install",
    "pool_options",
    "pool_release",
    "pool_resize",
    "rows_by_key",
    "rows_per_insert",
    "saver",
    "sql_execute_many",
    "sql_query",
    "sql_update_returning",
    "take_turn",
    "update_many",
    "urgent_writes",
    "writes_urgent",
]
