"""Overlap in real workers (`manage.py qcluster`) against a slow target on 127.0.0.1 that records
each request, its arrival and its answer (docs/schedules.md, "Overlap"). Three past occurrences
of a schedule are backfilled at once, as a catch-up makes them, under each policy: `skip` runs
the first and skips the two others; `bufferOne` runs the second once the first has answered and
skips the third; `allowAll` runs all three side by side. `cancelOther`: an occurrence falls due
while the previous waits for its retry, which is cancelled. On SQLite with one cluster, and on
PostgreSQL with two clusters sharing the work."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.ids import iso_ms
from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.api import ApiClient
from tests.support.schedules import calls_of, make_schedule, schedule_url
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]

HOUR = timedelta(hours=1)
PAST = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=1)
SLOW_MS = 1500
RETRY = {"maxAttempts": 3, "minBackoffMs": 60_000, "maxBackoffMs": 60_000, "retryOn": ["HttpError5xx"]}


def backfill(api: ApiClient, schedule, hours: int, first: int = 0) -> None:
    body = {"from": iso_ms(PAST + first * HOUR), "to": iso_ms(PAST + (first + hours - 1) * HOUR + timedelta(minutes=1))}
    answer = api.post(schedule_url(schedule.pk, suffix="/backfill"), body)
    assert answer.status_code == 200 and answer.json()["made"] == hours, answer.json()


def requests_of(target, policy: str) -> list[dict]:
    return sorted((r for r in target.requests if r["query"] == f"p={policy}"), key=lambda r: r["at"])


def settled(schedule) -> list[ServiceCall] | None:
    calls = [call for call in calls_of(schedule) if call.occurrence_at < datetime.now(UTC)]
    return calls if calls and all(call.is_terminal for call in calls) else None


def run_the_policies(world, http_target, start_clusters, count: int) -> None:
    api = ApiClient(world.acme_key)
    schedules = {
        policy: make_schedule(
            name=policy,
            cron="0 * * * *",
            timezone="UTC",
            url=http_target.url(f"/delay/{SLOW_MS}?p={policy}"),
            overlap=policy,
            paused=True,
        )
        for policy in ("skip", "bufferOne", "allowAll")
    }
    other = make_schedule(
        name="cancelOther",
        cron="0 * * * *",
        timezone="UTC",
        url=http_target.url("/status/503?p=cancelOther"),
        overlap="cancelOther",
        retry_policy=RETRY,
        paused=True,
    )
    start_clusters(count)
    for schedule in schedules.values():
        backfill(api, schedule, 3)
    backfill(api, other, 1)
    waiting = wait_for(lambda: (c := calls_of(other)[0]).attempts == 1 and c.status == "Scheduled" and c, timeout=20)
    backfill(api, other, 1, first=1)

    done = {policy: wait_for(lambda s=schedule: settled(s), timeout=30) for policy, schedule in schedules.items()}

    skip = done["skip"]
    assert [c.status for c in skip] == ["Succeeded", "Cancelled", "Cancelled"]
    assert [c.overlap_state for c in skip] == ["", "skipped", "skipped"]
    assert len(requests_of(http_target, "skip")) == 1

    buffered = done["bufferOne"]
    assert [c.status for c in buffered] == ["Succeeded", "Succeeded", "Cancelled"]
    assert [c.overlap_state for c in buffered] == ["", "buffered", "skipped"]
    first, second = requests_of(http_target, "bufferOne")
    assert second["at"] >= first["done"]  # it waited for the first's answer
    assert buffered[1].started_at >= buffered[0].finished_at

    together = done["allowAll"]
    assert [c.status for c in together] == ["Succeeded"] * 3
    arrivals = requests_of(http_target, "allowAll")
    assert len(arrivals) == 3 and max(r["at"] for r in arrivals) < min(r["done"] for r in arrivals)  # side by side

    def superseded():
        earlier, later = calls_of(other)[:2]
        return earlier.status == "Cancelled" and later.attempts >= 1 and (earlier, later)

    earlier, later = wait_for(superseded, timeout=20)
    assert earlier.pk == waiting.pk and (earlier.overlap_state, earlier.attempts) == ("superseded", 1)
    assert len(requests_of(http_target, "cancelOther")) >= 2

    # Each skipped occurrence counted once on its schedule and raised once, whoever decided it.
    for policy, skipped in (("skip", 2), ("bufferOne", 1), ("allowAll", 0)):
        body = api.get(schedule_url(schedules[policy].pk)).json()
        assert body["skippedByReason"].get("overlap", 0) == skipped, policy
        events = OutboxEvent.objects.filter(aggregate_id=schedules[policy].pk, event_type="ScheduleOccurrenceSkipped")
        assert sorted(e.event_payload["payload"]["occurrenceAt"] for e in events) == [
            iso_ms(c.occurrence_at) for c in done[policy] if c.overlap_state == "skipped"
        ]


def test_each_overlap_policy_in_one_cluster(world, http_target, clusters):
    run_the_policies(world, http_target, clusters, count=1)


@pytest.mark.postgres
def test_each_overlap_policy_with_two_clusters_on_postgres(world, http_target, clusters):
    run_the_policies(world, http_target, clusters, count=2)
