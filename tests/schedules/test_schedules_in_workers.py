"""Schedules in real workers (`manage.py qcluster`) against a target on 127.0.0.1 that records
what reaches it (docs/schedules.md): a catch-up after the workers were stopped (the occurrences
within the window run once each, the older ones are skipped and counted once), and a backfill
asked twice at the same moment while the workers run (each call made once, each run once). On
SQLite with one cluster, and on PostgreSQL with two clusters sharing the work. (The overlap
policies: test_overlap_engine.py. DST and jitter are decided by the loop and shown with its
clock injected, test_dst_choices.py and test_jitter.py: a transition cannot be waited for.)"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from core.ids import iso_ms
from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from schedules.cron import next_occurrences
from schedules.models import Schedule
from tests.support.api import ApiClient
from tests.support.schedules import calls_of, make_schedule, schedule_url
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]


def catch_up_and_backfill(world, http_target, start_clusters, count: int) -> None:
    now = datetime.now(UTC)
    # Stopped over five hourly runs; its minute half an hour from now, so none falls due meanwhile.
    minute = (now.minute + 30) % 60
    stopped = make_schedule(
        name="catch-up",
        cron=f"{minute} * * * *",
        timezone="UTC",
        url=http_target.url("/ok?catch-up"),
        now=now - timedelta(hours=5),
        overlap="allowAll",
    )
    missed = next_occurrences(stopped.cron, "UTC", after=now - timedelta(hours=5), count=10, end_at=now)
    assert len(missed) == 5
    Schedule.objects.filter(pk=stopped.pk).update(catchup_window_s=2 * 3600)  # the latest two
    hourly = make_schedule(name="backfilled", cron="0 * * * *", timezone="UTC", url=http_target.url("/ok?backfill"))

    start_clusters(count)
    # The backfill, asked twice at the same moment while the workers run.
    day = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    body = {"from": iso_ms(day), "to": iso_ms(day + timedelta(hours=5)), "overlap": "allowAll"}
    answers = []

    def ask() -> None:
        answers.append(ApiClient(world.acme_key).post(schedule_url(hourly.pk, suffix="/backfill"), body))

    askers = [threading.Thread(target=ask) for _ in range(2)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(30)
    assert sorted(a.status_code for a in answers) == [200, 200], [a.content for a in answers]
    assert sum(a.json()["made"] for a in answers) == 6  # made once in all, whichever ask made them

    def settled():
        fresh = Schedule.objects.get(pk=stopped.pk)
        past = [c for c in calls_of(stopped) if c.occurrence_at < now]
        if fresh.last_occurrence_at <= datetime.now(UTC) or not all(c.is_terminal for c in past):
            return None
        backfilled = [c for c in calls_of(hourly) if c.occurrence_at < now]
        return fresh if len(backfilled) == 6 and all(c.is_terminal for c in backfilled) else None

    fresh = wait_for(settled, timeout=30)
    # Catch-up: the two within the window ran, once each (the oldest made ahead before the stop
    # may have run too, if a timer got it first); the others skipped, each counted and raised once.
    ran = [c.occurrence_at for c in calls_of(stopped) if c.started_at is not None]
    assert sorted(ran) in (missed[-2:], [missed[0], *missed[-2:]])
    hits = [r for r in http_target.requests if r["query"] == "catch-up"]
    assert len(hits) == len(ran)
    assert fresh.skipped_count == 5 - len(ran) and fresh.skipped_reasons == {"catchupWindow": 5 - len(ran)}
    skipped = OutboxEvent.objects.filter(aggregate_id=stopped.pk, event_type="ScheduleOccurrenceSkipped")
    assert Counter(e.event_payload["payload"]["occurrenceAt"] for e in skipped) == Counter(
        iso_ms(at) for at in missed if at not in ran
    )
    # Backfill: six occurrences, six calls, six requests, however the two asks and the workers raced.
    backfilled = [c for c in calls_of(hourly) if c.occurrence_at < now]
    assert [c.occurrence_at for c in backfilled] == [day + timedelta(hours=h) for h in range(6)]
    assert all(c.status == ServiceCall.Status.SUCCEEDED for c in backfilled)
    assert Counter(r["headers"]["X-Service-Call-Id"] for r in http_target.requests if r["query"] == "backfill") == {
        str(c.pk): 1 for c in backfilled
    }


def test_catch_up_and_backfill_in_one_cluster(world, http_target, clusters):
    catch_up_and_backfill(world, http_target, clusters, count=1)


@pytest.mark.postgres
def test_catch_up_and_backfill_with_two_clusters_on_postgres(world, http_target, clusters):
    catch_up_and_backfill(world, http_target, clusters, count=2)
