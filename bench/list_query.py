"""The tag-filtered list at scale (bench/README.md): bulk-load a scratch SQLite DB, time the API's query.

    python bench/list_query.py --calls 1000000 --tenants 100

Loads rows straight into a freshly migrated database (executemany in big transactions):
every call has 1-3 tags from its tenant's 20 (a few common, most rarer), 5% are starred. Then
times random list queries built exactly as the API builds them
(orchestration.selectors.service_calls_for_tenant + orchestration.filters.ServiceCallFilter,
first page, newest first, tags prefetched) and prints their EXPLAIN QUERY PLAN. The last line
of stdout is the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PYTHON, ROOT, agent_env, summary_ms  # noqa: E402

TAGS = [
    "prod",
    "staging",
    "billing",
    "payments",
    "search",
    "nightly",
    "webhook",
    "partner-acme",
    "partner-globex",
    "reports",
    "sync",
    "crm",
    "inventory",
    "alerts",
    "audit",
    "export",
    "import",
    "mobile",
    "legacy",
    "canary",
]
# Tag popularity falls off with rank (1/(rank+1)): "prod" is on ~30% of calls, "canary" on ~2%.
TAG_WEIGHTS = [1 / (rank + 1) for rank in range(len(TAGS))]
PAGE = 25
BATCH = 50_000


def uuid7_hex(ms: int, rng: random.Random) -> str:
    value = (ms << 80) | (0x7 << 76) | (rng.getrandbits(12) << 64) | (0b10 << 62) | rng.getrandbits(62)
    return f"{value:032x}"


def sqlite_time(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ")


def load(db_path: Path, *, calls: int, tenants: int, seed: int) -> dict:
    """Bulk insert tenants, calls and tags; returns counts and the time taken."""
    rng = random.Random(seed)
    conn = sqlite3.connect(db_path)
    conn.create_function("REGEXP", 2, lambda pattern, value: re.search(pattern, value or "") is not None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")  # a scratch database: durability does not matter here
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute("PRAGMA cache_size=-262144")  # 256 MiB: index inserts stay in memory
    started = time.perf_counter()
    now = datetime.now(UTC).replace(microsecond=0)
    tenant_ids = [f"tenant-{index:03d}" for index in range(tenants)]
    with conn:
        conn.executemany(
            "INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)",
            [(tid, tid, sqlite_time(now - timedelta(days=400))) for tid in tenant_ids],
        )
    span_ms = 90 * 24 * 3600 * 1000  # three months of history
    first_ms = int(now.timestamp() * 1000) - span_ms
    call_sql = (
        "INSERT INTO service_calls (service_call_id, tenant_id, name, status, submitted_at, due_at, started_at,"
        " finished_at, request_spec, outcome_meta, error_kind, correlation_id, idempotency_key,"
        " request_fingerprint, rerun_of, attempts, held_ms, held_queue)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,NULL,'',NULL,?,0,'')"
    )
    tag_sql = "INSERT INTO service_call_tags (tenant_id, service_call_id, tag) VALUES (?,?,?)"
    tag_rows = 0
    call_batch: list[tuple] = []
    tag_batch: list[tuple] = []
    ok_meta = json.dumps(
        {
            "status": 200,
            "headers": {"Content-Type": "application/json"},
            "bodySnippet": '{"ok":true}',
            "bodyTruncated": False,
            "latencyMs": 42,
        }
    )
    failed_meta = json.dumps(
        {"kind": "HttpError", "message": "HTTP 503 Service Unavailable", "status": 503, "latencyMs": 87}
    )

    def flush() -> None:
        with conn:
            conn.executemany(call_sql, call_batch)
            conn.executemany(tag_sql, tag_batch)
        call_batch.clear()
        tag_batch.clear()

    for index in range(calls):
        ms = first_ms + index * span_ms // calls + rng.randrange(0, 50)
        call_id = uuid7_hex(ms, rng)
        tenant_id = tenant_ids[rng.randrange(tenants)]
        submitted = datetime.fromtimestamp(ms / 1000, UTC)
        roll = rng.random()
        if index >= calls - calls // 100:  # the newest 1% are still scheduled
            status, begun, finished, meta, kind = "Scheduled", None, None, None, None
            due = submitted + timedelta(hours=rng.randrange(1, 48))
        else:
            due = submitted + timedelta(seconds=rng.choice([0, 0, 0, 30, 600, 3600]))
            begun = due + timedelta(milliseconds=rng.randrange(1, 20))
            finished = begun + timedelta(milliseconds=rng.randrange(20, 400))
            if roll < 0.9:
                status, meta, kind = "Succeeded", ok_meta, None
            else:
                status, meta, kind = "Failed", failed_meta, "HttpError"
        spec = json.dumps(
            {
                "method": "POST",
                "url": f"https://api.example.com/{tenant_id}/hooks/{index % 97}",
                "headers": {"Content-Type": "application/json"},
                "body": {"n": index},
                "timeoutMs": 30000,
            }
        )
        call_batch.append(
            (
                call_id,
                tenant_id,
                f"call {index} {TAGS[index % len(TAGS)]}",
                status,
                sqlite_time(submitted),
                sqlite_time(due),
                sqlite_time(begun) if begun else None,
                sqlite_time(finished) if finished else None,
                spec,
                meta,
                kind,
                uuid.UUID(int=rng.getrandbits(128)).hex,
                1 if begun else 0,  # attempts made
            )
        )
        chosen = set()
        for _ in range(rng.choice((1, 1, 2, 2, 3))):
            chosen.add(rng.choices(TAGS, weights=TAG_WEIGHTS)[0])
        if rng.random() < 0.05:
            chosen.add("favorite")
        for tag in sorted(chosen):
            tag_batch.append((tenant_id, call_id, tag))
        tag_rows += len(chosen)
        if len(call_batch) >= BATCH:
            flush()
    if call_batch:
        flush()
    conn.close()
    return {"calls": calls, "tenants": tenants, "tags": tag_rows, "load_seconds": time.perf_counter() - started}


def explain(queryset) -> str:
    from django.db import connection

    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        rows = cursor.fetchall()
    return "\n".join(row[-1] for row in rows)


def plan_ok(plan: str) -> bool:
    return "service_call_tags_tag" in plan and not re.search(r"\bSCAN service_calls\b", plan)


def measure(*, queries: int, tenants: int, seed: int) -> dict:
    from orchestration.filters import ServiceCallFilter
    from orchestration.selectors import service_calls_for_tenant

    rng = random.Random(seed + 1)
    tenant_ids = [f"tenant-{index:03d}" for index in range(tenants)]

    def page(tenant_id: str, params: dict) -> tuple[list, object]:
        filterset = ServiceCallFilter(
            params, queryset=service_calls_for_tenant(tenant_id=tenant_id), tenant_id=tenant_id
        )
        if not filterset.is_valid():
            raise RuntimeError(filterset.errors)
        # As the API's keyset_page builds the first page: limit + 1 rows, newest first.
        queryset = filterset.qs.order_by("-pk")[: PAGE + 1]
        return list(queryset), queryset

    kinds = {
        "one_tag": lambda: {"tag": [rng.choice(TAGS)]},
        "two_tags": lambda: {"tag": rng.sample(TAGS, 2)},
        "status": lambda: {"status": [rng.choice(["Failed", "Scheduled"])]},
        "favorite": lambda: {"favorite": "true"},
    }
    results = {}
    for kind, make in kinds.items():
        for _ in range(20):  # warm the page cache and the connection
            page(rng.choice(tenant_ids), make())
        timings, sizes = [], []
        for _ in range(queries):
            tenant_id, params = rng.choice(tenant_ids), make()
            started = time.perf_counter()
            rows, _ = page(tenant_id, params)
            timings.append(time.perf_counter() - started)
            sizes.append(len(rows))
        example = {"tag": ["prod", "canary"]} if kind == "two_tags" else make()
        _, queryset = page(tenant_ids[0], example)
        plan = explain(queryset)
        results[kind] = {
            **summary_ms(timings),
            "mean_rows": sum(sizes) / len(sizes),
            "plan": plan,
            "plan_example": example,
            "plan_ok": plan_ok(plan)
            if "tag" in example or "favorite" in example
            else not re.search(r"\bSCAN service_calls\b", plan),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--queries", type=int, default=500, help="timed queries of each kind")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="bench-list-"))
    try:
        env = agent_env(data_dir)
        print(f"scratch database in {data_dir}; migrating", file=sys.stderr, flush=True)
        subprocess.run([PYTHON, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=300)
        print(f"loading {args.calls} calls over {args.tenants} tenants", file=sys.stderr, flush=True)
        loaded = load(data_dir / "event_service.db", calls=args.calls, tenants=args.tenants, seed=args.seed)
        print(f"loaded in {loaded['load_seconds']:.1f}s; querying", file=sys.stderr, flush=True)
        os.environ.update(env)
        import django

        django.setup()
        results = measure(queries=args.queries, tenants=args.tenants, seed=args.seed)
        size = (data_dir / "event_service.db").stat().st_size
        print(json.dumps({**loaded, "db_bytes": size, "queries": args.queries, "results": results}))
    finally:
        if args.keep:
            print(f"kept {data_dir}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
