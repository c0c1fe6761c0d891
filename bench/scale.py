"""History at scale on PostgreSQL (bench/README.md, "History at scale"): a scratch database
filled with many calls over many tenants, each with its tag, its timer, its attempt, its four
events, the delivery of its last event to its tenant's subscriber and that delivery's try; then
what a tenant's pages cost through the API, what retention of one day costs, the bytes on disk
per call, and what one idle cluster costs on it.

    python bench/scale.py [--calls 10000000] [--tenants 1000] [--days 7] [--keep]

The rows are made by the server, a day at a time (INSERT ... SELECT over generate_series, as the
product would have written them: UUID v7 keys from their times, each tenant's feed numbered
without gaps), into the tables the migrations made, partitions and indexes included. Tenants,
their subscriptions and API keys are made through the product's services. The one line of
stdout that opens with `{` is the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PYTHON, ROOT, Children, agent_env, log, summary_ms  # noqa: E402
from bench.database import ScratchPostgres  # noqa: E402

# Events a call makes in its life (Submitted, Scheduled, Running, Succeeded), the types a
# subscriber takes (its last), and the tags the calls carry (one each).
EVENTS = ("ServiceCallSubmitted", "ServiceCallScheduled", "ServiceCallRunning", "ServiceCallSucceeded")
SUBSCRIBED = ("ServiceCallSucceeded",)
TAGS = ("prod", "billing", "nightly", "sync", "reports")
# Tenants whose pages are read (an API key each), and the reads of each kind.
READERS = 20
PAGE_TARGET_MS = 50.0
# What the retention step's probe reads (retention_of_one_day).
PROBED_TABLES = ("outbox", "event_notifications", "event_delivery_attempts", "subscriptions")
HISTORY_TABLES = (
    "service_calls",
    "service_call_tags",
    "timer_schedules",
    "http_execution_log",
    "outbox",
    "event_notifications",
    "event_delivery_attempts",
)

# A UUID v7 from a time (ms) and a row's number: the time first, so keys sort as they were made.
UUID7 = """
CREATE FUNCTION pg_temp.uuid7(ms bigint, n bigint, salt text) RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
  SELECT (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid
  FROM md5(n::text || salt) AS h
$$
"""

# One day of calls, rows `first` to `last` of the whole history (a call's time is spread evenly
# from `start_ms` over `span_ms`); tenant i % tenants.
CALLS = """
INSERT INTO service_calls (service_call_id, tenant_id, name, status, submitted_at, due_at, started_at,
    finished_at, request_spec, outcome_meta, correlation_id, request_fingerprint, attempts, target_host,
    held_queue, held_ms)
SELECT pg_temp.uuid7(ms, i, 'call'), t, 'nightly report ' || i, 'Succeeded', at, at + interval '1 second',
    at + interval '1002 milliseconds', at + interval '1032 milliseconds',
    jsonb_build_object('method', 'POST', 'url', 'https://reports.example.com/run/' || (i %% 97),
        'headers', jsonb_build_object('Content-Type', 'application/json'), 'body', '{"report": "daily"}',
        'timeoutMs', 10000),
    jsonb_build_object('statusCode', 200, 'latencyMs', 30),
    md5(i::text), '', 1, 'reports.example.com', '', 0
FROM (SELECT i, %(start_ms)s + i * %(span_ms)s / %(calls)s AS ms, 'bench-' || lpad((i %% %(tenants)s)::text, 4, '0') AS t
      FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i) s,
     LATERAL (SELECT to_timestamp(ms / 1000.0) AS at) a
"""
TAGGED = """
INSERT INTO service_call_tags (tenant_id, service_call_id, tag)
SELECT 'bench-' || lpad((i %% %(tenants)s)::text, 4, '0'), pg_temp.uuid7(%(start_ms)s + i * %(span_ms)s / %(calls)s, i, 'call'),
    (%(tags)s::text[])[1 + i %% %(tag_count)s]
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
"""
TIMERS = """
INSERT INTO timer_schedules (tenant_id, service_call_id, correlation_id, due_at, registered_at, reached_at, state)
SELECT 'bench-' || lpad((i %% %(tenants)s)::text, 4, '0'), pg_temp.uuid7(ms, i, 'call'), md5(i::text),
    to_timestamp(ms / 1000.0) + interval '1 second', to_timestamp(ms / 1000.0),
    to_timestamp(ms / 1000.0) + interval '1 second', 'Reached'
FROM (SELECT i, %(start_ms)s + i * %(span_ms)s / %(calls)s AS ms FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i) s
"""
ATTEMPTS = """
INSERT INTO http_execution_log (execution_id, tenant_id, service_call_id, attempt, state, worker_id, started_at,
    finished_at, request_url, request_method, request_headers, request_body, timeout_ms, response_status,
    response_headers, response_body, response_body_truncated, latency_ms, connection_name)
SELECT pg_temp.uuid7(ms + 1002, i, 'attempt'), 'bench-' || lpad((i %% %(tenants)s)::text, 4, '0'),
    pg_temp.uuid7(ms, i, 'call'), 1, 'Finished', 'bench-worker', to_timestamp((ms + 1002) / 1000.0),
    to_timestamp((ms + 1032) / 1000.0), 'https://reports.example.com/run/' || (i %% 97), 'POST',
    '{"Content-Type": "application/json"}', '{"report": "daily"}', 10000, 200,
    '{"Content-Type": "application/json", "Content-Length": "16"}', '{"queued": true}', false, 30, ''
FROM (SELECT i, %(start_ms)s + i * %(span_ms)s / %(calls)s AS ms FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i) s
"""
# Event k of call i: made k * 300 ms after the call (the last, Succeeded, after its attempt);
# its tenant's feed number is 4 * (i div tenants) + k + 1.
OUTBOX = """
INSERT INTO outbox (event_id, tenant_id, aggregate_id, event_type, event_payload, created_at, published_at,
    attempts, last_error, feed_seq)
SELECT e, t, c, type, jsonb_build_object('id', e, 'type', type, 'tenantId', t, 'aggregateId', c,
        'timestampMs', ms + k * 344, 'correlationId', md5(i::text), 'causationId', null,
        'payload', jsonb_build_object('serviceCallId', c, 'status', 'Succeeded')),
    to_timestamp((ms + k * 344) / 1000.0), to_timestamp((ms + k * 344 + 20) / 1000.0), 1, '',
    4 * (i / %(tenants)s) + k + 1
FROM (SELECT i, %(start_ms)s + i * %(span_ms)s / %(calls)s AS ms, 'bench-' || lpad((i %% %(tenants)s)::text, 4, '0') AS t
      FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i) s,
     LATERAL (SELECT k, (%(events)s::text[])[k + 1] AS type FROM generate_series(0, 3) AS k) ks,
     LATERAL (SELECT pg_temp.uuid7(ms + k * 344, i * 4 + k, 'event') AS e, pg_temp.uuid7(ms, i, 'call') AS c) ids
"""
NOTIFICATIONS = """
INSERT INTO event_notifications (notification_id, subscription_id, tenant_id, event_id, event_seq, aggregate_id,
    event_type, envelope, event_created_at, state, attempts, step, manual, last_error, delivered_at, created_at,
    updated_at)
SELECT pg_temp.uuid7(ms + 1032, i, 'notification'), sub.subscription_id, t, o.event_id, o.id, o.aggregate_id,
    o.event_type, o.event_payload, o.created_at, 'SUCCEEDED', 1, 0, false, '', o.created_at + interval '40 ms',
    o.created_at + interval '20 ms', o.created_at + interval '40 ms'
FROM (SELECT i, %(start_ms)s + i * %(span_ms)s / %(calls)s AS ms, 'bench-' || lpad((i %% %(tenants)s)::text, 4, '0') AS t
      FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i) s
JOIN subscriptions sub ON sub.tenant_id = s.t
JOIN outbox o ON o.event_id = pg_temp.uuid7(ms + 3 * 344, i * 4 + 3, 'event')
"""
DELIVERY_TRIES = """
INSERT INTO event_delivery_attempts (notification_id, n, trigger, started_at, latency_ms, status_code,
    response_snippet, error)
SELECT pg_temp.uuid7(ms + 1032, i, 'notification'), 1, 'scheduled', to_timestamp((ms + 1052) / 1000.0), 18, 200, 'ok', ''
FROM (SELECT i, %(start_ms)s + i * %(span_ms)s / %(calls)s AS ms FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i) s
"""
COUNTERS = """
INSERT INTO outbox_feed_counters (tenant_id, last_seq)
SELECT tenant_id, max(feed_seq) FROM outbox GROUP BY tenant_id
ON CONFLICT (tenant_id) DO UPDATE SET last_seq = excluded.last_seq
"""


def make_tenants(tenants: int) -> dict[str, str]:
    """The tenants, each with a webhook subscription to its calls' last event; API keys for the
    readers. Through the product's services."""
    from delivery.services import subscription_create
    from delivery.validation import validate_subscription
    from tenants.services import api_key_create, tenant_create

    keys = {}
    for n in range(tenants):
        slug = f"bench-{n:04d}"
        tenant_create(slug=slug, name=slug)
        subscription_create(
            tenant_id=slug,
            data=validate_subscription(
                {"kind": "webhook", "name": "reports", "url": "http://127.0.0.1:9/hook", "eventTypes": list(SUBSCRIBED)}
            ),
        )
        if n < READERS:
            keys[slug] = api_key_create(tenant_id=slug, label="bench")[1]
    return keys


def fill(*, calls: int, tenants: int, days: int) -> dict[str, float]:
    """The history, a day at a time; returns seconds per table."""
    from django.db import connection

    now_ms = int(time.time() * 1000)
    span_ms = days * 86_400_000
    params = {
        "calls": calls,
        "tenants": tenants,
        "start_ms": now_ms - span_ms,
        "span_ms": span_ms,
        "tags": list(TAGS),
        "tag_count": len(TAGS),
        "events": list(EVENTS),
    }
    seconds: dict[str, float] = {}
    per_day = -(-calls // days)
    # Each day's partitions, as a running agent's retention loop made them ahead (core.partitions):
    # without them the past days' rows would wait in the DEFAULT partitions, and retention would
    # delete them row by row.
    from core.partitions import make_days
    from delivery.partitions import ATTEMPT_DAYS, NOTIFICATION_DAYS
    from outbox.partitions import OUTBOX_DAYS

    first_day = datetime.fromtimestamp((now_ms - span_ms) / 1000, UTC).date()
    dates = [first_day + timedelta(days=n) for n in range((datetime.now(UTC).date() - first_day).days + 1)]
    for spec in (OUTBOX_DAYS, NOTIFICATION_DAYS, ATTEMPT_DAYS):
        make_days(spec, dates)
    with connection.cursor() as cursor:
        cursor.execute(UUID7)
        cursor.execute("SET synchronous_commit = off")  # a scratch database: one flush less per day
        for day in range(days):
            first, last = day * per_day, min(calls, (day + 1) * per_day) - 1
            if first > last:
                break
            for name, statement in (
                ("service_calls", CALLS),
                ("service_call_tags", TAGGED),
                ("timer_schedules", TIMERS),
                ("http_execution_log", ATTEMPTS),
                ("outbox", OUTBOX),
                ("event_notifications", NOTIFICATIONS),
                ("event_delivery_attempts", DELIVERY_TRIES),
            ):
                started = time.perf_counter()
                cursor.execute(statement, {**params, "first": first, "last": last})
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started
            log(f"day {day + 1}/{days}: calls {first:,} to {last:,} made ({sum(seconds.values()):.0f}s so far)")
        cursor.execute(COUNTERS)
    return seconds


def timed_gets(client, paths: list[tuple[str, str]]) -> list[float]:
    took = []
    for path, key in paths:
        started = time.perf_counter()
        response = client.get(path, HTTP_AUTHORIZATION=f"Bearer {key}")
        took.append(time.perf_counter() - started)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} answered {response.status_code}: {response.content[:300]!r}")
    return took


def pages(keys: dict[str, str], *, reads: int, seed: int) -> dict[str, dict[str, float]]:
    """List, feed and detail pages through the API (Django's test client: the views, their
    queries and their serializers, no network), after a warm-up read of each kind."""
    from django.test import Client

    from orchestration.models import ServiceCall
    from outbox.models import OutboxEvent, OutboxFeedCounter

    rng = random.Random(seed)
    client = Client()
    readers = sorted(keys)
    heads = dict(OutboxFeedCounter.objects.filter(tenant_id__in=readers).values_list("tenant_id", "last_seq"))
    base = "/api/tenants/{}/"

    def pick() -> str:
        return rng.choice(readers)

    lists, tagged, feeds, details = [], [], [], []
    for _ in range(reads):
        tenant = pick()
        lists.append((base.format(tenant) + "service-calls", keys[tenant]))
        tenant = pick()
        tagged.append((base.format(tenant) + f"service-calls?tag={rng.choice(TAGS)}", keys[tenant]))
        tenant = pick()
        # A page from a place in the middle of the feed (`after` an event's id), as a reader
        # catching up reads.
        after = OutboxEvent.objects.get(tenant_id=tenant, feed_seq=rng.randrange(1, heads[tenant])).event_id
        feeds.append((base.format(tenant) + f"events?after={after}", keys[tenant]))
    for tenant in readers:
        ids = (
            ServiceCall.objects.filter(tenant_id=tenant)
            .order_by("?")
            .values_list("pk", flat=True)[: reads // len(readers) + 1]
        )
        details += [(base.format(tenant) + f"service-calls/{pk}", keys[tenant]) for pk in ids]
    rng.shuffle(details)
    results = {}
    for name, paths in (("list", lists), ("list_by_tag", tagged), ("feed", feeds), ("detail", details[:reads])):
        timed_gets(client, paths[:3])  # warm-up
        results[name] = summary_ms(timed_gets(client, paths))
    return results


def retention_of_one_day(days: int) -> dict[str, float]:
    """What the retention loop does once the oldest day is past retention (workers/loops/
    retention.py), timed: that day's history goes. Meanwhile a probe reads each history table
    and the subscriptions, one round after another on a connection of its own, as the loops and
    pages read them: its slowest round is the longest a query waited for the step. The time the
    detached days' drops took (core.partitions.drop_detached: the files freed while nothing the
    loops read is locked) is timed apart."""
    import threading
    from contextlib import nullcontext

    from django.db import connection
    from django.test import override_settings

    import core.partitions
    from workers.loops.retention import RetentionLoop

    class Gate:
        def slot(self):
            return nullcontext()

    class Host:
        """What the loop asks of its engine: a write gate and a place for its run records."""

        gate = Gate()
        runs: list[dict] = []

        def record_run(self, loop, **run):
            self.runs.append(run)

    probing, rounds = threading.Event(), []

    def probe() -> None:
        try:
            with connection.cursor() as cursor:
                while not probing.is_set():
                    started = time.perf_counter()
                    for table in PROBED_TABLES:
                        cursor.execute(f"SELECT 1 FROM {table} LIMIT 1")
                        cursor.fetchall()
                    rounds.append(time.perf_counter() - started)
                    time.sleep(0.005)
        finally:
            connection.close()

    dropping = []
    drop_detached = core.partitions.drop_detached

    def timed_drop_detached(*args, **kwargs):
        started = time.perf_counter()
        try:
            return drop_detached(*args, **kwargs)
        finally:
            dropping.append(time.perf_counter() - started)

    host = Host()
    prober = threading.Thread(target=probe)
    prober.start()
    core.partitions.drop_detached = timed_drop_detached
    try:
        time.sleep(0.2)
        with override_settings(OUTBOX_RETENTION_DAYS=days - 1, RETENTION_DAYS=days - 1):
            started = time.perf_counter()
            RetentionLoop(host).step()
            seconds = time.perf_counter() - started
        time.sleep(0.2)
    finally:
        core.partitions.drop_detached = drop_detached
        probing.set()
        prober.join()
    return {
        "seconds": seconds,
        "dropping_detached_seconds": sum(dropping),
        "longest_query_wait_ms": max(rounds) * 1000,
        "probe_rounds": len(rounds),
        "rows_or_partitions": sum(run["items"] for run in host.runs),
    }


def bytes_on_disk() -> dict[str, int]:
    from django.db import connection

    sizes = {}
    with connection.cursor() as cursor:
        for table in HISTORY_TABLES:
            # A partitioned table's size is its partitions' (pg_partition_tree), a plain one's its own.
            cursor.execute(
                "SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%s::regclass)), "
                "pg_total_relation_size(%s::regclass))",
                [table, table],
            )
            sizes[table] = int(cursor.fetchone()[0])
    return sizes


def idle(env: dict[str, str], log_dir: Path) -> dict[str, float]:
    from bench import agent

    children = Children(log_dir)
    try:
        workers = agent.start_workers(children, env)
        return agent.idle_figures(workers, seconds=10.0)
    finally:
        children.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--days", type=int, default=7, help="the history's span; retention drops the oldest day")
    parser.add_argument("--reads", type=int, default=300, help="timed API reads of each kind")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    if args.days < 2 or args.tenants < READERS or args.calls < args.tenants * args.days:
        parser.error(f"--days at least 2, --tenants at least {READERS}, --calls at least tenants × days")

    postgres = ScratchPostgres()
    reason = postgres.unreachable_reason()
    if reason:
        print(f"bench/scale.py needs PostgreSQL: {reason}", file=sys.stderr)
        return 2
    data_dir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    env = agent_env(data_dir, DATABASE_URL=postgres.url)
    result: dict = {"calls": args.calls, "tenants": args.tenants, "days": args.days}
    try:
        postgres.create()
        log(f"migrating {postgres.name}")
        subprocess.run([PYTHON, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=600)
        os.environ.update(env)
        import django

        django.setup()
        started = time.perf_counter()
        keys = make_tenants(args.tenants)
        log(f"{args.tenants} tenants with their subscriptions made; filling {args.calls:,} calls over {args.days} days")
        result["fill_seconds"] = {
            "tenants": time.perf_counter() - started,
            **fill(calls=args.calls, tenants=args.tenants, days=args.days),
        }
        # As a database that has run a while: analysed, its visibility map set (autovacuum would
        # do both later, during the idle figures, whose transactions it would add).
        postgres.vacuum_analyze()
        result["bytes"] = bytes_on_disk()
        result["bytes_per_call"] = sum(result["bytes"].values()) / args.calls
        log("reading pages through the API")
        result["pages_ms"] = pages(keys, reads=args.reads, seed=args.seed)
        log("idle cluster on the filled database")
        result["idle"] = idle(env, data_dir)
        log("retention of the oldest day")
        result["retention"] = retention_of_one_day(args.days)
        report(result)
        print(json.dumps(result, default=str))
        return 0
    finally:
        if args.keep:
            log(f"kept the database {postgres.name}")
        else:
            postgres.drop()


def report(result: dict) -> None:
    rows = [("row", "Service Agent", "target")]
    for name, figures in result["pages_ms"].items():
        target = f"≤ {PAGE_TARGET_MS:.0f} ms" if name in ("list", "feed") else ""
        rows.append((f"{name} page p50 / p95 (ms)", f"{figures['p50']:.1f} / {figures['p95']:.1f}", target))
    retention = result["retention"]
    gone = retention["seconds"] - retention["dropping_detached_seconds"]
    rows.append(("retention of one day: until it left the history (s)", f"{gone:.2f}", "≤ 1 s"))
    rows.append(
        ("… then its detached tables dropped, nothing locked (s)", f"{retention['dropping_detached_seconds']:.2f}", "")
    )
    rows.append(("… the whole step (s)", f"{retention['seconds']:.2f}", ""))
    rows.append(("… longest a query of the history waited (ms)", f"{retention['longest_query_wait_ms']:.1f}", ""))
    rows.append(("bytes on disk per call", f"{result['bytes_per_call']:,.0f}", ""))
    idle = result["idle"]
    rows.append(("idle cluster: transactions a second", f"{idle.get('transactions_per_second', 0):.1f}", "≤ 5"))
    rows.append(("idle cluster: CPU (% of one core)", f"{idle['cpu_percent']:.2f}", "≤ 1"))
    rows.append(("idle cluster: connections", f"{idle.get('connections', 0):.0f}", ""))
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("| " + " | ".join(cell.ljust(width[i]) for i, cell in enumerate(row)) + " |")


if __name__ == "__main__":
    sys.exit(main())
