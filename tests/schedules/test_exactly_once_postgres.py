"""Exactly one call per occurrence however many loops run (docs/schedules.md), on PostgreSQL.

Two real processes, each with its own connection, drive schedules_materialize over the same
schedules, minute after minute of an injected clock, both released at each minute together.
Each schedule's row is claimed with SELECT ... FOR UPDATE SKIP LOCKED and updated on its
revision; the call itself is unique on (tenant, schedule, occurrence) in the database, and a
third test makes one occurrence from two connections at the same instant to show that the
database, not luck or the lock, keeps it to one call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from orchestration.models import ServiceCall
from schedules.cron import next_occurrences
from schedules.making import make_occurrence as _make
from schedules.models import Schedule
from schedules.services import backfill_plan, schedule_backfill
from tests.support.schedules import make_schedule
from tests.workers.cluster import database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
SCHEDULES = 40
MINUTES = 12
# Ahead of the real clock, so that each call's due time is its occurrence.
START = (datetime.now(UTC) + timedelta(days=2)).replace(second=0, microsecond=0)

# A loop process: for each instant read from stdin, materialize until nothing is left that
# it can advance, then say how many it advanced (the test's barrier between minutes).
LOOP = """
import sys
import django
django.setup()
from datetime import datetime
from schedules.materialize import schedules_materialize
for line in sys.stdin:
    now = datetime.fromisoformat(line.strip())
    advanced = 0
    while True:
        done = schedules_materialize(now=now, limit=7)
        advanced += done.advanced
        if done.failed:
            print("failed", done.failed, flush=True)
        if not done.advanced:
            break
    print(advanced, flush=True)
"""


def _loop_process(tmp_path: Path) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST"))}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "eventservice.settings",
            "DATABASE_URL": database_url(),
            "DATA_DIR": str(tmp_path),
            "EGRESS_ALLOWLIST": "127.0.0.0/8,::1",
            "LOG_LEVEL": "WARNING",
            "EVENT_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
    )
    return subprocess.Popen(
        [sys.executable, "-c", LOOP],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_loops_racing_make_every_occurrence_exactly_once(world, tmp_path):
    schedules = [
        make_schedule(name=f"race {n}", cron="* * * * *" if n % 2 else "*/2 * * * *", timezone="UTC", now=START)
        for n in range(SCHEDULES)
    ]
    loops = [_loop_process(tmp_path) for _ in range(2)]
    advanced = Counter()
    try:
        for minute in range(1, MINUTES + 1):
            now = START + timedelta(minutes=minute, milliseconds=300)
            for loop in loops:
                loop.stdin.write(now.isoformat() + "\n")
                loop.stdin.flush()
            for n, loop in enumerate(loops):
                line = loop.stdout.readline().strip()
                assert line.isdigit(), f"loop {n}: {line!r}\n{loop.stderr.read() if loop.poll() is not None else ''}"
                advanced[n] += int(line)
    finally:
        for loop in loops:
            loop.stdin.close()
            loop.wait(timeout=30)
    connection.close()  # see the other processes' commits

    made = Counter(ServiceCall.objects.values_list("schedule_id", "occurrence_at"))
    assert max(made.values()) == 1
    last_now = START + timedelta(minutes=MINUTES, milliseconds=300)
    rounds = 0
    for schedule in schedules:
        due = next_occurrences(schedule.cron, "UTC", after=START, count=10_000, end_at=last_now)
        ahead = next_occurrences(schedule.cron, "UTC", after=last_now, count=1)
        got = sorted(at for (schedule_id, at) in made if schedule_id == schedule.schedule_id)
        assert got == due + ahead, schedule.name  # every occurrence once, and the next one made ahead
        rounds += len(due)
    assert set(Schedule.objects.values_list("skipped_count", flat=True)) == {0}
    assert ServiceCall.objects.exclude(status=ServiceCall.Status.SCHEDULED).count() == 0
    # Both loops did work: the rows were shared, not serialised behind one loop.
    assert advanced[0] > 0 and advanced[1] > 0
    assert advanced[0] + advanced[1] == rounds


def test_one_occurrence_made_from_two_connections_at_once_is_one_call(world):
    schedule = make_schedule(name="twice", cron="0 * * * *", timezone="UTC", now=START)
    at = START + timedelta(hours=5)
    barrier = threading.Barrier(2)
    answers: list = []

    def make() -> None:
        try:
            barrier.wait(timeout=10)
            answers.append(_make(schedule, at).pk)
        finally:
            connection.close()

    threads = [threading.Thread(target=make) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(answers) == 2 and answers[0] == answers[1]
    assert ServiceCall.objects.filter(schedule_id=schedule.schedule_id, occurrence_at=at).count() == 1


def test_a_backfill_asked_from_two_connections_at_once_makes_each_call_once(world):
    """docs/schedules.md, "Backfill": the same past range asked twice at the same instant."""
    schedule = make_schedule(name="backfilled", cron="*/10 * * * *", timezone="UTC")
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    start = end - timedelta(hours=2)
    plan = backfill_plan(tenant_id="acme", schedule_id=schedule.pk, start=start, end=end)
    barrier = threading.Barrier(2)
    made: list[int] = []

    def backfill() -> None:
        try:
            barrier.wait(timeout=10)
            made.append(len(schedule_backfill(tenant_id="acme", schedule_id=schedule.pk, instants=plan).made))
        finally:
            connection.close()

    threads = [threading.Thread(target=backfill) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(made) == [0, len(plan)]  # the schedule's row lock: one makes them, the other finds them
    live = Counter(
        ServiceCall.objects.filter(schedule_id=schedule.pk, occurrence_at__lte=end)
        .exclude(status=ServiceCall.Status.CANCELLED)
        .values_list("occurrence_at", flat=True)
    )
    assert sorted(live) == plan and set(live.values()) == {1}
