"""The Celery peer: a bench app on the Redis broker (`celery -A bench.celery_app worker`).

Tasks write what the bench measures into Redis: ETA lateness (now - eta) and completions.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
LATENESS_KEY = "bench:celery:lateness"
DONE_KEY = "bench:celery:done"
PING_KEY = "bench:celery:ping"
QUEUE = "bench"
DRAIN_QUEUE = "bench-drain"

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
