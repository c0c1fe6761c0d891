"""The peers a Django user would otherwise pick, measured in the same run on the same machine:
django-q2's one-shot schedules and ORM broker, Celery's ETA tasks and workers on Redis."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

from bench.agent import Delivery, delivery_figures
from bench.common import (
    PYTHON,
    REDIS_URL,
    Child,
    Children,
    cpu_seconds,
    group_pids,
    log,
    pids_named,
    summary_ms,
    wait_until,
)

# --- Celery (Redis broker) --------------------------------------------------------------------


def redis_unreachable_reason() -> str | None:
    """None when the bench's Redis database answers; else why Celery is skipped."""
    try:
        import celery  # noqa: F401
    except ImportError:
        return "celery is not installed (pip install -r requirements-bench.txt)"
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=2).ping()
    except redis.RedisError as exc:
        return f"Redis unreachable at {REDIS_URL} ({type(exc).__name__})"
    return None


def _redis():
    import redis

    return redis.Redis.from_url(REDIS_URL)


def celery_reset() -> None:
    """The bench owns Redis database 14 (BENCH_REDIS_URL): it empties it before and after."""
    _redis().flushdb()


def start_celery(children: Children, env: dict[str, str], *, concurrency: int = 2, timeout: float = 60.0) -> Child:
    from bench import celery_app

    celery_reset()
    child = children.start(
        "celery-worker",
        [
            PYTHON,
            "-m",
            "celery",
            "-A",
            "bench.celery_app",
            "worker",
            "-Q",
            f"{celery_app.QUEUE},{celery_app.DELIVER_QUEUE}",
            "--concurrency",
            str(concurrency),
            "--loglevel",
            "WARNING",
            "-n",
            "bench@%h",
            "--without-gossip",
            "--without-mingle",
        ],
        env={**env, "BENCH_REDIS_URL": REDIS_URL},
    )
    celery_app.ping.delay()
    r = _redis()

    def ready() -> bool:
        if child.proc.poll() is not None:
            raise RuntimeError(f"celery worker exited early:\n{child.tail()}")
        return bool(r.get(celery_app.PING_KEY))

    if not wait_until(ready, timeout=timeout, interval=0.1):
        raise RuntimeError(f"celery worker not ready within {timeout}s:\n{child.tail()}")
    return child


def celery_lateness(*, count: int, lead: float = 3.0, spread: float = 10.0, seed: int = 12) -> dict:
    """ETA tasks due uniformly over [now+lead, now+lead+spread]; each records now - eta."""
    from bench import celery_app

    r = _redis()
    r.delete(celery_app.LATENESS_KEY)
    rng = random.Random(seed)
    now = time.time()
    etas = sorted(now + lead + rng.uniform(0, spread) for _ in range(count))
    log(f"celery lateness: sending {count} ETA tasks")
    started = time.perf_counter()
    for eta in etas:
        celery_app.record_lateness.apply_async(args=[eta], eta=datetime.fromtimestamp(eta, UTC))
    sent = time.perf_counter() - started
    wait_until(
        lambda: r.llen(celery_app.LATENESS_KEY) >= count, timeout=max(0.0, etas[-1] - time.time()) + 20, interval=0.1
    )
    values = [float(v) for v in r.lrange(celery_app.LATENESS_KEY, 0, -1)]
    return {
        "tasks": count,
        "done": len(values),
        "send_seconds": sent,
        "lateness_ms": summary_ms(values),
        "early": sum(1 for v in values if v < 0),
    }


def celery_drain(*, count: int) -> dict:
    """`count` no-op tasks waiting in a queue; the worker starts consuming it; until all done."""
    from bench import celery_app

    r = _redis()
    r.delete(celery_app.DONE_KEY)
    log(f"celery drain: enqueueing {count} no-op tasks")
    for _ in range(count):
        celery_app.noop.apply_async(queue=celery_app.DRAIN_QUEUE)
    started = time.perf_counter()
    celery_app.app.control.add_consumer(celery_app.DRAIN_QUEUE, reply=False)

    def done() -> bool:
        return int(r.get(celery_app.DONE_KEY) or 0) >= count

    wait_until(done, timeout=120, interval=0.002)
    elapsed = time.perf_counter() - started
    completed = int(r.get(celery_app.DONE_KEY) or 0)
    return {"tasks": count, "done": completed, "seconds": elapsed, "rate": completed / elapsed}


def celery_same_work(
    *, count: int, url: str, delivery: Delivery, worker: Child, inline: bool = False, timeout: float = 300
) -> dict:
    """`count` calls' work (bench/peer_work.py) queued at once, as the agent's burst: each task
    GETs `url` and queues a delivery task per event and subscriber (the two receivers of
    `delivery` and, when its stream is made, NATS), or with `inline` makes those deliveries
    itself (bench/celery_app.py `call`). The rate is to the last call's task done;
    then until every event reached every subscriber: their lag, and the CPU per call of the
    worker's processes and of the Redis servers running on this machine (the broker's work is
    Celery's, as SQLite's is the agent's; neither side's NATS server or receivers count)."""
    from bench import celery_app

    r = _redis()
    r.delete(celery_app.CALLS_DONE_KEY, celery_app.DELIVERY_FAILURES_KEY)
    hooks = [f"{receiver}/hook" for _, receiver in delivery.receivers]
    nats_url = delivery.nats_url if delivery.stream_made else ""
    how = "deliveries inline" if inline else "a task per delivery"
    log(f"celery same work, {how}: enqueueing {count} calls ({len(hooks)} webhooks{', NATS' if nats_url else ''})")
    tenant = f"bench-celery-{'inline' if inline else 'tasks'}"
    for _ in range(count):
        celery_app.call.apply_async(
            args=[url, tenant, hooks, nats_url, delivery.prefix, inline], queue=celery_app.CALLS_QUEUE
        )
    pids = group_pids(worker.proc.pid)
    redis_pids = pids_named("redis-server")
    cpu_before, redis_before = cpu_seconds(pids), cpu_seconds(redis_pids)
    started = time.perf_counter()
    celery_app.app.control.add_consumer(celery_app.CALLS_QUEUE, reply=False)
    wait_until(lambda: int(r.get(celery_app.CALLS_DONE_KEY) or 0) >= count, timeout=timeout, interval=0.002)
    calls_seconds = time.perf_counter() - started
    # The next burst is queued whole before it is consumed, as this one.
    celery_app.app.control.cancel_consumer(celery_app.CALLS_QUEUE, reply=True, timeout=10)
    calls = int(r.get(celery_app.CALLS_DONE_KEY) or 0)
    expected = 2 * calls  # each call's Running and Succeeded (or Failed) events
    all_delivered, figures = celery_deliveries(delivery, expected=expected, timeout=timeout)
    cpu, redis_cpu = cpu_seconds(pids) - cpu_before, cpu_seconds(redis_pids) - redis_before
    return {
        "calls": calls,
        "seconds": calls_seconds,
        "rate": calls / calls_seconds,
        "all_delivered": all_delivered,
        "events_expected": expected,
        "events_seen": figures["events"],  # by at least one subscriber
        "delivery": figures,
        "delivery_failures": int(r.get(celery_app.DELIVERY_FAILURES_KEY) or 0),
        "cpu_seconds": cpu,
        "redis_cpu_seconds": redis_cpu if redis_pids else None,
        "cpu_ms_per_call": (cpu + redis_cpu) * 1000 / calls if calls else None,
    }


def celery_deliveries(delivery: Delivery, *, expected: int, timeout: float) -> tuple[bool, dict]:
    """Waits until every subscriber of `delivery` (its receivers, and its stream when made) has
    `expected` events; whether all arrived, and the figures of what did (agent.delivery_figures:
    lag from each event's making, read from its UUIDv7 id)."""
    from bench import peer_work

    nats = delivery.stream_made

    def delivered() -> bool:
        """Every subscriber has at least an arrival per event (counted: the records themselves
        are read once, after, so the wait takes little from the machine Celery runs on)."""
        counts = [delivery.webhook_count(base) for _, base in delivery.receivers]
        if nats:
            counts.append(delivery.stream_count())  # the stream keeps a message once (Nats-Msg-Id)
        return all(count >= expected for count in counts)

    waited = bool(wait_until(delivered, timeout=timeout, interval=0.25))
    latest = {f"webhook-{n}": delivery.webhook_records(base) for n, (_, base) in enumerate(delivery.receivers, 1)}
    if nats:
        latest["nats"] = delivery.stream_records()
    events = {event_id for arrivals in latest.values() for event_id, _ in arrivals}
    # The counts include a receiver's retried requests: only its distinct events say all came.
    all_delivered = waited and all(len({e for e, _ in arrivals}) >= expected for arrivals in latest.values())
    return all_delivered, delivery_figures({event_id: peer_work.created_at(event_id) for event_id in events}, latest)


# --- django-q2 (ORM broker on the same SQLite database) ---------------------------------------

HOLD_KEY = "bench-hold"


def start_djq(children: Children, env: dict[str, str], *, timeout: float = 60.0) -> Child:
    """A stock django-q2 cluster (bench/djq_settings.py), the agent's engine off."""
    from bench.agent import start_workers

    return start_workers(
        children,
        {**env, "DJANGO_SETTINGS_MODULE": "bench.djq_settings", "ENGINE_ENABLED": "false"},
        name="djq-qcluster",
        timeout=timeout,
    )


def djq_drain(*, count: int) -> dict:
    """`count` async_task no-ops; they become visible to the cluster at one instant.

    Done when the broker holds none of them: django-q2's monitor deletes a task's queue row
    only after saving its result (stock save_limit=250 prunes result rows, so they cannot be
    counted).
    """
    from django.conf import settings
    from django_q.models import OrmQ, Task
    from django_q.tasks import async_task

    log(f"django-q2 drain: enqueueing {count} no-op tasks")
    key = settings.Q_CLUSTER["name"]
    for _ in range(count):
        # Enqueued under a key no cluster reads, then moved to the cluster's key at once.
        async_task("bench.tasks.noop", cluster=HOLD_KEY, group="bench-drain")
    started = time.perf_counter()
    OrmQ.objects.filter(key=HOLD_KEY).update(key=key)
    wait_until(lambda: not OrmQ.objects.filter(key=key).exists(), timeout=120, interval=0.01)
    elapsed = time.perf_counter() - started
    completed = count - OrmQ.objects.filter(key=key).count()
    saved = Task.objects.filter(group="bench-drain").count()
    return {
        "tasks": count,
        "done": completed,
        "seconds": elapsed,
        "rate": completed / elapsed,
        "result_rows_kept": saved,
    }


def djq_lateness(*, count: int, lead: float = 3.0, spread: float = 10.0, wait: float = 75.0, seed: int = 12) -> dict:
    """One-shot schedules due over [now+lead, now+lead+spread]; when each task ran - due.

    django-q2 sets a Task's `started` when the task is enqueued (by its scheduler, here), not
    when a worker runs it; `stopped` of a no-op is when it ran, so that is the start time.
    """
    from django_q.models import Schedule, Task

    rng = random.Random(seed)
    now = time.time()
    dues = sorted(now + lead + rng.uniform(0, spread) for _ in range(count))
    names = {f"bench-late-{index}": due for index, due in enumerate(dues)}
    log(
        f"django-q2 lateness: {count} one-shot schedules; its scheduler wakes about every 30 s "
        f"(waiting up to {wait:.0f} s)"
    )
    Schedule.objects.bulk_create(
        [
            Schedule(
                name=name,
                func="bench.tasks.noop",
                schedule_type=Schedule.ONCE,
                repeats=-1,
                next_run=datetime.fromtimestamp(due, UTC),
            )
            for name, due in names.items()
        ]
    )
    deadline = now + wait

    def done() -> bool:
        return Task.objects.filter(group__in=list(names)).count() >= count

    wait_until(done, timeout=max(0.0, deadline - time.time()), interval=0.25)
    rows = list(Task.objects.filter(group__in=list(names)).values_list("group", "started", "stopped"))
    values = [stopped.timestamp() - names[group] for group, _, stopped in rows]
    enqueued = [started.timestamp() - names[group] for group, started, _ in rows]
    Schedule.objects.filter(name__in=list(names)).delete()
    return {
        "schedules": count,
        "done": len(values),
        "lateness_ms": summary_ms(values),
        "enqueued_lateness_ms": summary_ms(enqueued),
        "early": sum(1 for v in values if v < 0),
    }
