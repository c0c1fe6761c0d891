"""A Python load client for POST /api/tenants/<t>/service-calls, or the same POSTs to the
floor view (bench/floor.py); its own process, no Django.

Threads with one requests.Session each send `--total` POSTs as fast as answers come; prints
one JSON line: rate (202 answers per second; `rate_all` counts every answer), latency
percentiles (of every answer), status counts.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import requests


def body(index: int, due: str, target: str) -> bytes:
    return json.dumps(
        {
            "name": f"submit-{index}",
            "requestSpec": {"method": "POST", "url": target, "headers": {"X-Bench": "1"}, "body": {"n": index}},
            "dueAt": due,
            "tags": ["bench", "submit"],
        }
    ).encode()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="the collection URL (http://127.0.0.1:port/api/...)")
    parser.add_argument("--key", required=True, help="the tenant's API key")
    parser.add_argument("--target", required=True, help="the URL the submitted calls would call")
    parser.add_argument("--total", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=64)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args()
    if not args.url.startswith("http://127.0.0.1:"):
        raise SystemExit("the load client only talks to 127.0.0.1")

    due = (datetime.now(UTC) + timedelta(hours=1)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    headers = {"Authorization": f"Bearer {args.key}", "Content-Type": "application/json"}
    lock = threading.Lock()
    counter = iter(range(args.total))
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    deadline = time.monotonic() + args.max_seconds

    def worker() -> None:
        with requests.Session() as session:
            session.trust_env = False
            while time.monotonic() < deadline:
                with lock:
                    index = next(counter, None)
                if index is None:
                    return
                started = time.perf_counter()
                try:
                    response = session.post(args.url, data=body(index, due, args.target), headers=headers, timeout=30)
                    status = response.status_code
                except requests.RequestException as exc:
                    status = 0
                    with lock:
                        errors[type(exc).__name__] += 1
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
                    statuses[status] += 1

    # Warm-up: every gunicorn worker and thread imports and connects before the clock starts.
    warm = [threading.Thread(target=_warm, args=(args, due, headers)) for _ in range(args.threads)]
    for thread in warm:
        thread.start()
    for thread in warm:
        thread.join()
    threads = [threading.Thread(target=worker) for _ in range(args.threads)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    ms = [value * 1000 for value in latencies]
    print(
        json.dumps(
            {
                "client": f"python requests, {args.threads} threads",
                "requests": len(latencies),
                "accepted": statuses[202],
                "seconds": elapsed,
                "rate": statuses[202] / elapsed,
                "rate_all": len(latencies) / elapsed,
                "p50_ms": percentile(ms, 50),
                "p95_ms": percentile(ms, 95),
                "p99_ms": percentile(ms, 99),
                "max_ms": max(ms) if ms else math.nan,
                "statuses": {str(code): n for code, n in sorted(statuses.items())},
                "errors": dict(errors),
            }
        )
    )


def _warm(args: argparse.Namespace, due: str, headers: dict[str, str]) -> None:
    with requests.Session() as session:
        session.trust_env = False
        for index in range(max(1, args.warmup // max(1, args.threads))):
            session.post(args.url, data=body(-1 - index, due, args.target), headers=headers, timeout=30)


if __name__ == "__main__":
    main()
