"""The Celery peer: a bench app on the Redis broker (`celery -A bench.celery_app worker`).

Tasks write what the bench measures into Redis: ETA lateness (now - eta) and completions. The
no-op tasks are the drain's peer as the targets define it; `bench.call` and its delivery tasks
do a drained call's network work (bench/peer_work.py), for the rows beside it.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

import redis
from celery import Celery

from bench import peer_work

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
LATENESS_KEY = "bench:celery:lateness"
DONE_KEY = "bench:celery:done"
PING_KEY = "bench:celery:ping"
QUEUE = "bench"
DRAIN_QUEUE = "bench-drain"
CALLS_QUEUE = "bench-calls"  # consumed from the moment the burst is queued, as DRAIN_QUEUE
DELIVER_QUEUE = "bench-deliver"  # consumed from the worker's start
CALLS_DONE_KEY = "bench:celery:calls-done"
DELIVERY_FAILURES_KEY = "bench:celery:delivery-failures"
# As the agent's schedule begins: the first retry after 5 s (docs/events.md).
DELIVERY_RETRY_SECONDS = 5
DELIVERY_RETRIES = 7

app = Celery("bench", broker=REDIS_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(REDIS_URL)
    return _client


@app.task(name="bench.eta")
def record_lateness(eta: float) -> None:
    client().rpush(LATENESS_KEY, time.time() - eta)


@app.task(name="bench.noop")
def noop() -> None:
    client().incr(DONE_KEY)


@app.task(name="bench.ping")
def ping() -> None:
    client().set(PING_KEY, "1")


@app.task(name="bench.call")
def call(
    url: str,
    tenant_id: str,
    receivers: list[str],
    nats_url: str,
    subject_prefix: str,
    inline: bool,
    eta: float | None = None,
) -> None:
    """A drained call's work: its request, then a delivery task per event and subscriber (as the
    agent: one subscriber's failure is retried alone, a slow one holds no other), or with
    `inline` each delivery made in this task, once (the cheapest a Celery user could write: no
    retry, and a slow subscriber holds the call's worker). Given the task's `eta` (the capacity
    steps), its start's lateness goes to LATENESS_KEY first, as the agent's startedAt − dueAt."""
    if eta is not None:
        client().rpush(LATENESS_KEY, time.time() - eta)
    subject = f"{subject_prefix}.{tenant_id}"
    for event in peer_work.call(url, tenant_id=tenant_id):
        for receiver in receivers:
            if inline:
                _once(peer_work.deliver_webhook, receiver, event)
            else:
                deliver_webhook.apply_async(args=[receiver, event.event_id, event.body], queue=DELIVER_QUEUE)
        if nats_url:
            if inline:
                _once(functools.partial(peer_work.publish_nats, nats_url), subject, event)
            else:
                publish_nats.apply_async(args=[nats_url, subject, event.event_id, event.body], queue=DELIVER_QUEUE)
    client().incr(CALLS_DONE_KEY)


def _once(deliver: Callable[[str, peer_work.Event], None], to: str, event: peer_work.Event) -> None:
    try:
        deliver(to, event)
    except Exception:
        client().incr(DELIVERY_FAILURES_KEY)


@app.task(name="bench.deliver_webhook", bind=True, max_retries=DELIVERY_RETRIES)
def deliver_webhook(self, url: str, event_id: str, body: str) -> None:
    try:
        peer_work.deliver_webhook(url, peer_work.Event(event_id, body))
    except Exception as exc:
        client().incr(DELIVERY_FAILURES_KEY)
        raise self.retry(exc=exc, countdown=DELIVERY_RETRY_SECONDS) from exc


@app.task(name="bench.publish_nats", bind=True, max_retries=DELIVERY_RETRIES)
def publish_nats(self, nats_url: str, subject: str, event_id: str, body: str) -> None:
    try:
        peer_work.publish_nats(nats_url, subject, peer_work.Event(event_id, body))
    except Exception as exc:
        client().incr(DELIVERY_FAILURES_KEY)
        raise self.retry(exc=exc, countdown=DELIVERY_RETRY_SECONDS) from exc
