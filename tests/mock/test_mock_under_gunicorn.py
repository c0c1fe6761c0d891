"""The mock target cannot starve the product: a real gunicorn, many slow mock requests, /healthz."""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.agent_process import agent_env, gunicorn, manage

SLOW_REQUESTS = 20
DELAY_MS = 8000
SLOTS = 3  # MOCK_DELAY_CONCURRENCY's default, per process (the test below checks it is)


def test_the_default_bound_is_three_slots_per_process():
    from eventservice import settings as production

    assert production.MOCK_DELAY_CONCURRENCY == SLOTS


def _get(port: int, path: str, timeout: float = 20) -> tuple[int, dict[str, str], bytes, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        return response.status, dict(response.getheaders()), body, time.monotonic() - started
    finally:
        conn.close()


@pytest.mark.serial  # /healthz and the refusals answer within 3 s
def test_slow_mock_requests_leave_healthz_answering_and_the_excess_gets_503(tmp_path):
    env = agent_env(tmp_path)
    env.pop("MOCK_DELAY_CONCURRENCY", None)  # the default bound
    migrated = manage(env, "migrate", "--noinput", "-v0")
    assert migrated.returncode == 0, migrated.stderr

    # One worker with four threads: without a bound of its own, four sleeping mock requests
    # would take every thread and /healthz would wait for them.
    with gunicorn(env, workers=1, threads=4) as port, ThreadPoolExecutor(SLOW_REQUESTS) as pool:
        slow = [pool.submit(_get, port, f"/mock/delay/{DELAY_MS}") for _ in range(SLOW_REQUESTS)]
        # The excess is refused at once, so its answers are back long before the delay ends.
        deadline = time.monotonic() + 5
        while sum(f.done() for f in slow) < SLOW_REQUESTS - SLOTS and time.monotonic() < deadline:
            time.sleep(0.05)

        status, _, body, took = _get(port, "/healthz", timeout=10)
        assert took < 3, f"/healthz took {took:.1f}s while mock requests slept"
        assert status in (200, 503) and "status" in json.loads(body)

        results = [f.result(timeout=DELAY_MS / 1000 + 10) for f in slow]

    refused = [r for r in results if r[0] == 503]
    served = [r for r in results if r[0] == 200]
    assert (len(served), len(refused)) == (SLOTS, SLOW_REQUESTS - SLOTS)
    assert all(r[1]["Retry-After"] == "10" and r[3] < 3 for r in refused)
    assert all(r[3] >= DELAY_MS / 1000 for r in served)
