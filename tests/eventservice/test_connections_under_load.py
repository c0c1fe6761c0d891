"""The web keeps within its connection pools under load (docs/deploy.md, "Connections"): a real
`runserver` and a real gunicorn (as the shipped unit runs it) on PostgreSQL each get 500
concurrent API requests with a real key (submissions, lists, a call's detail): all at once for
gunicorn, 100 at a time for runserver (Django's development server listens with a backlog of
10, and more at once would wait on TCP's retries of the connects, not on the agent). No answer is a
5xx, and the servers' connections, counted all along with the query the guide gives, never
exceed the bound the guide states: `DB_POOL_SIZE` per process. And a request that finds no
connection free within `DB_POOL_TIMEOUT_SECONDS` gets a 503 with `Retry-After`, not a hang.

The servers reach PostgreSQL directly, also in the pass behind PgBouncer (whose server
connections would hide the servers' own): what is counted is what their pools hold."""

from __future__ import annotations

import asyncio
import re
import shlex
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import psycopg
import pytest
import requests

from eventservice.database import DB_POOL_SIZE_DEFAULT
from tests.support.agent_process import ROOT, agent_env, gunicorn, runserver
from tests.support.api import call_url, calls_url, valid_payload
from tests.support.factories import HOUR, make_call
from tests.support.waiting import wait_for
from tests.workers.cluster import direct_database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

REQUESTS = 500
# Open at once against runserver (its listen backlog is 10).
RUNSERVER_AT_ONCE = 100
# The servers' connections, told apart from the test's own in pg_stat_activity.
APP = "service-agent-load-test"
DOC = ROOT / "docs" / "deploy.md"
WEB_UNIT = ROOT / "deploy" / "systemd" / "service-agent-web.service"


def documented_count_query() -> str:
    """The guide's query of connections by application_name, for a database given as %s."""
    [line] = [
        line for line in DOC.read_text().splitlines() if "pg_stat_activity" in line and "application_name" in line
    ]
    sql = shlex.split(line)[shlex.split(line).index("-c") + 1]
    assert "datname = 'service_agent'" in sql
    return sql.replace("'service_agent'", "%s")


def unit_gunicorn_shape() -> tuple[int, int]:
    """(--workers, --threads) of the shipped web unit."""
    text = WEB_UNIT.read_text()
    return int(re.search(r"--workers (\d+)", text).group(1)), int(re.search(r"--threads (\d+)", text).group(1))


class ConnectionCount(threading.Thread):
    """The most connections `APP` held in the test database, sampled every 20 ms from the
    server's maintenance database (so that the sampling is not counted)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.server = url.rsplit("/", 1)[0].replace("postgres://", "postgresql://", 1) + "/postgres"
        self.database = url.rsplit("/", 1)[1]
        self.query = documented_count_query()
        self.most = 0
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.server, autocommit=True) as conn:
            while not self.stop.is_set():
                rows = dict(conn.execute(self.query, [self.database]).fetchall())
                self.most = max(self.most, rows.get(APP, 0))
                self.samples += 1
                time.sleep(0.02)

    def __enter__(self) -> ConnectionCount:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(timeout=10)


def server_env(tmp_path: Path) -> dict[str, str]:
    """The agent on the test database, straight to PostgreSQL, with the default pool."""
    env = agent_env(tmp_path, DATABASE_URL=direct_database_url(), PGAPPNAME=APP)
    for name in ("DB_POOL_SIZE", "DB_POOL_TIMEOUT_SECONDS", "DATABASE_POOLER", "DATABASE_DIRECT_URL"):
        env.pop(name, None)
    return env


async def _burst(port: int, key: str, call_id: str, at_once: int) -> Counter:
    """REQUESTS requests, `at_once` at a time (0: all): a third submissions, a third lists, a
    third a call's detail."""
    base = f"http://127.0.0.1:{port}"
    answers: Counter = Counter()
    timeout = aiohttp.ClientTimeout(total=45)
    connector = aiohttp.TCPConnector(limit=at_once, force_close=True)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers={"Authorization": f"Bearer {key}"}
    ) as session:

        async def one(n: int) -> None:
            try:
                if n % 3 == 0:
                    response = await session.post(base + calls_url(), json=valid_payload(name=f"load {n}"))
                elif n % 3 == 1:
                    response = await session.get(base + calls_url() + "?limit=5")
                else:
                    response = await session.get(base + call_url(call_id))
                await response.read()
                answers[response.status] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                answers[type(exc).__name__] += 1

        await asyncio.gather(*(one(n) for n in range(REQUESTS)))
    return answers


def _load(port: int, key: str, call_id: str, count: ConnectionCount, *, at_once: int = 0) -> tuple[Counter, float]:
    started = time.monotonic()
    answers = asyncio.run(_burst(port, key, call_id, at_once))
    took = time.monotonic() - started
    time.sleep(0.1)  # a last sample after the last answer
    assert count.samples > 0
    return answers, took


def _assert_no_5xx(answers: Counter) -> None:
    assert sum(answers.values()) == REQUESTS
    # Submissions are accepted (202), reads answered (200): nothing else, no 5xx, no reset.
    assert set(answers) <= {200, 202}, answers


def test_runserver_answers_500_concurrent_requests_within_its_pool(world, tmp_path):
    call = make_call("acme", name="read")
    env = server_env(tmp_path)
    with runserver(env) as port, ConnectionCount(env["DATABASE_URL"]) as count:
        answers, took = _load(port, world.acme_key, str(call.pk), count, at_once=RUNSERVER_AT_ONCE)
    print(f"runserver: {dict(answers)} in {took:.1f}s, at most {count.most} connections")
    _assert_no_5xx(answers)
    # One process: its pool (docs/deploy.md, "Connections"); a thread per request without one.
    assert 0 < count.most <= DB_POOL_SIZE_DEFAULT


def test_gunicorn_as_the_unit_runs_it_answers_500_concurrent_requests_within_its_pools(world, tmp_path):
    call = make_call("acme", name="read")
    workers, threads = unit_gunicorn_shape()
    assert threads > DB_POOL_SIZE_DEFAULT  # the bound is the pool's, not the threads'
    env = server_env(tmp_path)
    with gunicorn(env, workers=workers, threads=threads) as port, ConnectionCount(env["DATABASE_URL"]) as count:
        answers, took = _load(port, world.acme_key, str(call.pk), count)
    print(f"gunicorn {workers}x{threads}: {dict(answers)} in {took:.1f}s, at most {count.most} connections")
    _assert_no_5xx(answers)
    assert 0 < count.most <= workers * DB_POOL_SIZE_DEFAULT


def _waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
        return conn.execute(query, [APP]).fetchone()[0] > 0


def test_a_request_that_finds_no_connection_free_in_time_gets_a_503(world, tmp_path):
    call = make_call("acme", name="held", due_in=HOUR)
    env = {**server_env(tmp_path), "DB_POOL_SIZE": "1", "DB_POOL_TIMEOUT_SECONDS": "1"}
    url = env["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    headers = {"Authorization": f"Bearer {world.acme_key}"}
    with gunicorn(env, workers=1, threads=4) as port, psycopg.connect(url) as locker:
        base = f"http://127.0.0.1:{port}"
        # The call's row held by another transaction: a cancel of it waits, holding the one
        # connection of the server's pool.
        locker.execute("SELECT 1 FROM service_calls WHERE service_call_id = %s FOR UPDATE", [call.pk])
        with ThreadPoolExecutor(1) as pool:
            cancel = pool.submit(requests.post, base + call_url(call.pk, suffix="/cancel"), headers=headers, timeout=30)
            wait_for(lambda: _waiting_on_a_lock(url), timeout=20)

            started = time.monotonic()
            read = requests.get(base + calls_url(), headers=headers, timeout=30)
            page = requests.get(base + "/login/", cookies={"sessionid": "a-session-to-look-up"}, timeout=30)
            waited = time.monotonic() - started
            locker.rollback()
            cancelled = cancel.result(timeout=30)

    assert read.status_code == 503 and read.headers["Retry-After"] == "1"
    assert read.headers["Content-Type"] == "application/problem+json"
    assert read.json()["type"] == "urn:service-agent:problem:database-busy"
    assert page.status_code == 503 and page.headers["Retry-After"] == "1"
    assert "no database connection free" in page.text
    assert 2 <= waited < 10  # a second each, not for ever
    # The cancel that held the connection went through once the row was free.
    assert cancelled.status_code == 200, cancelled.text
    # Each 503 is logged once, as a warning naming the cause.
    log = (tmp_path / f"gunicorn-{port}.log").read_text()
    assert log.count("no database connection came free in time: answered 503") == 2
    assert "Service Unavailable" not in log
