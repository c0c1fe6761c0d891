"""Overlap (docs/schedules.md, "Overlap"): what an occurrence's call does when it falls due while an
earlier call of its schedule is still going (Running, or waiting for a retry), decided at its
start: `skip` cancels it and counts the occurrence skipped (the schedule's count, the events,
/metrics), `bufferOne` lets one wait until the going call ends and skips a second, `allowAll`
starts it beside, `cancelOther` cancels the earlier calls still Scheduled. A retry is never
decided again; a catch-up's calls due together take their turn in occurrence order. The
starts and finishes here are the engine's own services, on the test database; the policies
in real workers: tests/schedules/test_overlap_engine.py."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from core.ids import iso_ms, utcnow
from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall
from orchestration.services import CallKey, service_call_cancel, service_calls_finish, service_calls_start
from outbox.models import OutboxEvent
from schedules.making import make_occurrence_call
from schedules.models import Schedule
from schedules.selectors import skipped_of
from tests.support.api import ApiClient
from tests.support.locks import in_another_connection, row_locked_elsewhere
from tests.support.schedules import make_schedule, schedule_url
from timer.models import TimerSchedule

# Each decision on SQLite and again on PostgreSQL (row locks, two connections: the tests below).
pytestmark = pytest.mark.also_postgres

HOUR = timedelta(hours=1)
PAST = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=1)
RETRY = {"maxAttempts": 3, "minBackoffMs": 60_000, "maxBackoffMs": 60_000, "retryOn": ["HttpError5xx"]}


def schedule_with(overlap: str, **extra) -> Schedule:
    return make_schedule(cron="0 * * * *", timezone="UTC", overlap=overlap, paused=True, **extra)


def due_now(schedule: Schedule, *hours: int) -> list[ServiceCall]:
    """Calls for past occurrences of the hourly schedule, due now (as a catch-up or backfill makes them)."""
    return [make_occurrence_call(schedule, PAST + h * HOUR, at_once=True)[0] for h in hours]


def start(*calls: ServiceCall) -> set:
    return {started.service_call_id for started in service_calls_start(keys=[CallKey("acme", c.pk) for c in calls])}


def finish(call: ServiceCall, outcome: Outcome | None = None) -> None:
    fresh = ServiceCall.objects.get(pk=call.pk)
    assert service_calls_finish(
        results=[(CallKey("acme", call.pk, fresh.attempts), outcome or Outcome(succeeded=True, status=200))]
    )


def fresh(call: ServiceCall) -> ServiceCall:
    return ServiceCall.objects.get(pk=call.pk)


def events(type_: str, aggregate) -> list[dict]:
    rows = OutboxEvent.objects.filter(event_type=type_, aggregate_id=aggregate).order_by("event_id")
    return [row.event_payload["payload"] for row in rows]


def test_skip_cancels_an_occurrence_due_while_the_previous_runs_and_counts_it_everywhere(world, client):
    schedule = schedule_with("skip")
    first, second = due_now(schedule, 0, 1)
    assert start(first) == {first.pk}
    assert start(second) == set()

    skipped = fresh(second)
    assert (skipped.status, skipped.overlap, skipped.overlap_state) == ("Cancelled", "skip", "skipped")
    assert not TimerSchedule.objects.filter(service_call_id=second.pk).exists()
    assert events("ServiceCallCancelled", second.pk)[0]["reason"] == "overlap"
    assert events("ScheduleOccurrenceSkipped", schedule.pk) == [
        {"scheduleId": str(schedule.pk), "occurrenceAt": iso_ms(PAST + HOUR), "reason": "overlap"}
    ]
    # Counted on the schedule (API, list), beside the loop's reasons, and on /metrics.
    body = ApiClient(world.acme_key).get(schedule_url(schedule.pk)).json()
    assert (body["overlap"], body["skippedCount"], body["skippedByReason"]) == ("skip", 1, {"overlap": 1})
    listed = ApiClient(world.acme_key).get("/api/tenants/acme/schedules").json()["results"]
    assert [row["skippedCount"] for row in listed] == [1]
    call_body = ApiClient(world.acme_key).get(f"/api/tenants/acme/service-calls/{second.pk}").json()
    assert (call_body["overlap"], call_body["overlapState"]) == ("skip", "skipped")
    metrics = ApiClient(world.acme_key).get("/metrics").content.decode()
    assert 'serviceagent_schedule_occurrences_skipped{reason="overlap"} 1.0' in metrics

    # Once the first has finished, the next occurrence starts.
    finish(first)
    (third,) = due_now(schedule, 2)
    assert start(third) == {third.pk}


def test_a_call_waiting_for_its_retry_is_still_going_and_its_retry_is_never_skipped(world):
    schedule = schedule_with("skip", retry_policy=RETRY)
    first, second, third = due_now(schedule, 0, 1, 2)
    assert start(first) == {first.pk}
    finish(first, Outcome.failure(ErrorKind.HTTP_ERROR, "503", status=503))
    assert (fresh(first).status, fresh(first).attempts) == ("Scheduled", 1)  # waits for its retry
    assert start(second) == set() and fresh(second).overlap_state == "skipped"
    # The retry comes due while a later occurrence runs (allowAll made it, say): it goes on.
    ServiceCall.objects.filter(pk=first.pk).update(due_at=utcnow())
    ServiceCall.objects.filter(pk=third.pk).update(overlap="allowAll")
    assert start(third) == {third.pk}
    assert start(first) == {first.pk} and fresh(first).attempts == 2


def test_buffer_one_keeps_one_waiting_until_the_previous_ends_and_skips_a_second(world):
    schedule = schedule_with("bufferOne")
    first, second, third = due_now(schedule, 0, 1, 2)
    assert start(first) == {first.pk}
    before = utcnow()
    assert start(second) == set()
    waiting = fresh(second)
    assert (waiting.status, waiting.overlap_state) == ("Scheduled", "buffered")
    # Looked at again within a minute at the latest (a missed end cannot strand it).
    assert before + timedelta(seconds=59) < waiting.due_at <= utcnow() + timedelta(seconds=60)
    assert TimerSchedule.objects.get(service_call_id=second.pk).due_at == waiting.due_at
    assert start(third) == set() and fresh(third).overlap_state == "skipped"
    assert events("ScheduleOccurrenceSkipped", schedule.pk)[0]["occurrenceAt"] == iso_ms(PAST + 2 * HOUR)

    finish(first)  # its end releases the one waiting: due now, its timer armed now
    released = fresh(second)
    assert released.due_at <= utcnow() and TimerSchedule.objects.get(service_call_id=second.pk).due_at <= utcnow()
    assert start(second) == {second.pk}
    assert fresh(second).status == "Running"
    assert skipped_of(Schedule.objects.get(pk=schedule.pk)) == (1, {"overlap": 1})


def test_buffer_one_is_released_by_a_cancel_of_the_call_waiting_for_its_retry(world):
    schedule = schedule_with("bufferOne", retry_policy=RETRY)
    first, second = due_now(schedule, 0, 1)
    start(first)
    finish(first, Outcome.failure(ErrorKind.HTTP_ERROR, "503", status=503))
    assert start(second) == set() and fresh(second).overlap_state == "buffered"
    service_call_cancel(tenant_id="acme", service_call_id=first.pk)
    assert fresh(second).due_at <= utcnow()
    assert start(second) == {second.pk}


def test_allow_all_starts_beside_the_going_call(world):
    schedule = schedule_with("allowAll")
    first, second = due_now(schedule, 0, 1)
    assert start(first) == {first.pk}
    assert start(second) == {second.pk}
    assert fresh(second).overlap_state == ""


def test_cancel_other_cancels_the_earlier_calls_still_scheduled_and_leaves_a_running_one(world):
    schedule = schedule_with("cancelOther", retry_policy=RETRY)
    first, second, third = due_now(schedule, 0, 1, 2)
    start(first)
    finish(first, Outcome.failure(ErrorKind.HTTP_ERROR, "503", status=503))  # waits for a retry
    assert start(second) == {second.pk}
    superseded = fresh(first)
    assert (superseded.status, superseded.overlap_state) == ("Cancelled", "superseded")
    assert events("ServiceCallCancelled", first.pk) == [
        {
            "serviceCallId": str(first.pk),
            "cancelledAt": iso_ms(superseded.finished_at),
            "attempt": 1,
            "reason": "overlap",
        }
    ]
    # It had run once: not a skipped occurrence.
    assert events("ScheduleOccurrenceSkipped", schedule.pk) == []
    # A Running earlier call finishes its attempt; the next starts beside it.
    assert start(third) == {third.pk}
    assert fresh(second).status == "Running"


def test_a_catch_up_due_together_runs_in_occurrence_order_under_each_policy(world):
    """Calls due at once start in one transaction: the oldest first, the others decided against it."""
    for overlap, expected in (
        ("skip", ["Running", "Cancelled", "Cancelled"]),
        ("bufferOne", ["Running", "Scheduled", "Cancelled"]),
        ("allowAll", ["Running", "Running", "Running"]),
        # The latest takes over from the others, which never ran: skipped occurrences.
        ("cancelOther", ["Cancelled", "Cancelled", "Running"]),
    ):
        schedule = schedule_with(overlap, name=overlap)
        calls = due_now(schedule, 0, 1, 2)
        start(*reversed(calls))
        assert [fresh(call).status for call in calls] == expected, overlap
        assert skipped_of(Schedule.objects.get(pk=schedule.pk))[0] == expected.count("Cancelled"), overlap


def test_a_schedules_policy_reaches_only_its_own_calls(world):
    """Another schedule's, or another tenant's, going call does not count."""
    mine, other = schedule_with("skip", name="mine"), schedule_with("skip", name="other")
    (running,) = due_now(other, 0)
    start(running)
    (call,) = due_now(mine, 0)
    assert start(call) == {call.pk}


def test_a_change_of_policy_applies_to_the_calls_made_after_it(world):
    api = ApiClient(world.acme_key)
    schedule = make_schedule(cron="0 * * * *", timezone="UTC")
    (ahead,) = ServiceCall.objects.filter(schedule_id=schedule.pk, status="Scheduled")
    assert ahead.overlap == "skip"
    answer = api.patch(schedule_url(schedule.pk), {"overlap": "bufferOne"})
    assert answer.status_code == 200 and answer.json()["overlap"] == "bufferOne"
    (remade,) = ServiceCall.objects.filter(schedule_id=schedule.pk, status="Scheduled")
    assert remade.overlap == "bufferOne" and remade.occurrence_at == ahead.occurrence_at


@pytest.mark.parametrize("value", ["never", "", None, 3, ["skip"], "Skip", "skip\x00"])
def test_a_bad_overlap_is_a_400_naming_the_field_and_nothing_is_stored(world, value):
    from tests.support.schedules import schedule_payload, schedules_url

    api = ApiClient(world.acme_key)
    answer = api.post(schedules_url(), schedule_payload(overlap=value))
    assert answer.status_code == 400 and "overlap" in answer.json()["errors"], answer.json()
    assert not Schedule.objects.exists()
    schedule = schedule_with("skip")
    answer = api.patch(schedule_url(schedule.pk), {"overlap": value})
    assert answer.status_code == 400 and "overlap" in answer.json()["errors"]
    assert Schedule.objects.get(pk=schedule.pk).overlap == "skip"
    answer = api.post(
        schedule_url(schedule.pk, suffix="/backfill"),
        {"from": iso_ms(PAST), "to": iso_ms(PAST + HOUR), "overlap": value},
    )
    if value is None:
        assert answer.status_code == 200  # absent or null: the schedule's
    else:
        assert answer.status_code == 400 and "overlap" in answer.json()["errors"]


def test_an_occurrence_due_after_an_earlier_one_not_started_yet_waits_for_it(world):
    """Started in separate transactions (the workers' starts race), a catch-up keeps its order."""
    schedule = schedule_with("skip")
    first, second = due_now(schedule, 0, 1)
    before = utcnow()
    assert start(second) == set()
    assert (fresh(second).status, fresh(second).overlap_state) == ("Scheduled", "")  # not decided yet
    # Its timer fires again in a moment (PUT_OFF) after the start, whatever the backlog loop does
    # (from the start's clock: a loaded machine may take longer than the moment to get here).
    assert before < TimerSchedule.objects.get(service_call_id=second.pk).due_at < before + timedelta(seconds=1)
    assert start(first) == {first.pk}
    assert start(second) == set() and fresh(second).overlap_state == "skipped"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgres_a_going_call_another_transaction_holds_leaves_the_decision_for_a_moment(world):
    """Its finish may be under way: the call neither starts nor is skipped until it is over, so a
    finish never misses the call it would release, and a skip never follows a finished call."""
    schedule = schedule_with("bufferOne")
    first, second = due_now(schedule, 0, 1)
    start(first)
    with row_locked_elsewhere(ServiceCall, first.pk):
        assert start(second) == set()
        assert (fresh(second).status, fresh(second).overlap_state) == ("Scheduled", "")
        assert TimerSchedule.objects.get(service_call_id=second.pk).due_at > utcnow()
    assert start(second) == set() and fresh(second).overlap_state == "buffered"
    # The finish waits for no lock of a start (the start skips what it cannot lock).
    finish(first)
    assert start(second) == {second.pk}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgres_a_buffer_and_the_end_it_waits_for_never_miss_each_other(world):
    """A start that buffers holds the going call's row until it commits: that call's finish, in
    another connection at the same moment, waits for it and then releases the buffered one."""
    schedule = schedule_with("bufferOne")
    first, second = due_now(schedule, 0, 1)
    start(first)
    finished = threading.Event()

    def finish_elsewhere():
        finish(first)
        finished.set()

    with transaction.atomic():
        assert start(second) == set()  # buffered, holding first's row
        runner = threading.Thread(target=in_another_connection, args=(finish_elsewhere,))
        runner.start()
        assert not finished.wait(0.5)  # the finish waits for this transaction
    runner.join(10)
    assert finished.is_set()
    assert fresh(second).due_at <= utcnow()  # released by the finish that followed
    assert start(second) == {second.pk}


def test_the_pages_the_command_and_the_admin_know_the_policy(world, admin_client):
    from django.test import Client

    from tests.commands.cli import call

    owner = Client()
    owner.force_login(world.owner)
    form = {
        "name": "buffered",
        "cron": "30 2 * * *",
        "timezone": "UTC",
        "method": "GET",
        "url": "http://127.0.0.1:9/x",
        "body_format": "json",
    }
    assert owner.post("/schedules/new/", {**form, "overlap": "always"}).status_code == 400
    assert not Schedule.objects.exists()
    owner.post("/schedules/new/", {**form, "overlap": "bufferOne"})
    made = Schedule.objects.get(name="buffered")
    assert made.overlap == "bufferOne"
    (ahead,) = ServiceCall.objects.filter(schedule_id=made.pk)
    assert ahead.overlap == "bufferOne"
    detail = owner.get(f"/schedules/{made.pk}/").content.decode()
    assert 'id="overlap">bufferOne' in detail and 'name="overlap"' in detail  # shown, and the backfill's choice

    # A skipped call says why on its page, and the schedule's list counts it.
    (running,) = due_now(made, 0)
    start(running)
    (skipped,) = due_now(made, 1)
    (third,) = due_now(made, 2)
    start(skipped), start(third)
    assert fresh(third).overlap_state == "skipped"
    assert "was still going" in owner.get(f"/calls/{third.pk}/").content.decode()
    assert "Waiting for its schedule's earlier call" in owner.get(f"/calls/{skipped.pk}/").content.decode()
    listed = owner.get("/schedules/").content.decode()
    assert '<td class="num">1</td>' in listed
    # The admin shows the policy and the count by reason.
    html = admin_client.get(f"/admin/schedules/schedule/{made.pk}/change/").content.decode()
    assert "bufferOne" in html and "overlap: 1" in html

    argv = ["create_schedule", "--tenant=acme", "--cron=0 3 * * *", "--method=GET", "--url=http://127.0.0.1:9/x"]
    result = call(*argv, "--name=cli", "--overlap=cancelOther")
    assert result.code == 0, result.err
    assert Schedule.objects.get(name="cli").overlap == "cancelOther"
    refused = call(*argv, "--name=bad", "--overlap=never")
    assert refused.code != 0 and "--overlap" in refused.err and not Schedule.objects.filter(name="bad").exists()


def test_the_new_schedule_page_takes_a_retry_policy_and_formats_json(world):
    from django.test import Client

    owner = Client()
    owner.force_login(world.owner)
    page = owner.get("/schedules/new/").content.decode()
    assert 'id="format-body"' in page and 'name="max_attempts"' in page and 'name="retry_on"' in page
    form = {
        "name": "retried",
        "cron": "30 2 * * *",
        "timezone": "UTC",
        "method": "GET",
        "url": "http://127.0.0.1:9/x",
        "body_format": "json",
        "max_attempts": "3",
        "retry_on": ["HttpError5xx", "Timeout"],
    }
    assert owner.post("/schedules/new/", {**form, "max_attempts": "99"}).status_code == 400
    assert not Schedule.objects.exists()
    owner.post("/schedules/new/", form)
    made = Schedule.objects.get(name="retried")
    assert made.retry_policy["maxAttempts"] == 3 and made.retry_policy["retryOn"] == ["HttpError5xx", "Timeout"]
