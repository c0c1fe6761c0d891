"""Overlap at its edges (docs/schedules.md, "Overlap"): a retry started in the same transaction
as a new occurrence is going; a buffered call that ran and waits for its retry no longer takes
the one place of the waiting; the end of any call of the schedule releases the one waiting;
flow control's hold ends when a call starts waiting for its schedule instead; a change plans
the occurrences to come and leaves a past occurrence's call alone; the order of due times wins
over the order of occurrences (no head-of-line stall); /metrics and list_schedules count as the
API does; on PostgreSQL a finish committed while a start reads is seen."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.ids import utcnow
from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall
from orchestration.services import CallKey, service_calls_start
from orchestration.services.start import service_calls_start_overdue
from schedules.models import Schedule
from schedules.selectors import skipped_occurrences_by_reason, skipped_of
from tests.schedules.test_overlap import RETRY, due_now, finish, fresh, schedule_with, start
from tests.support.api import ApiClient
from tests.support.locks import paused_in_another_connection
from tests.support.schedules import make_schedule, schedule_url

pytestmark = pytest.mark.also_postgres

FAILED = Outcome.failure(ErrorKind.HTTP_ERROR, "503", status=503)


def waiting_for_its_retry(schedule):
    first, second = due_now(schedule, 0, 1)
    start(first)
    finish(first, FAILED)
    ServiceCall.objects.filter(pk=first.pk).update(due_at=utcnow())  # its retry is due with the next
    return first, second


def test_a_retry_started_in_the_same_transaction_is_going(world):
    first, second = waiting_for_its_retry(schedule_with("skip", retry_policy=RETRY))
    assert start(first, second) == {first.pk}
    assert fresh(second).overlap_state == "skipped"


def test_cancel_other_cancels_a_retry_due_in_the_same_transaction(world):
    first, second = waiting_for_its_retry(schedule_with("cancelOther", retry_policy=RETRY))
    assert start(first, second) == {second.pk}
    assert (fresh(first).status, fresh(first).overlap_state) == ("Cancelled", "superseded")


def test_a_buffered_call_that_ran_and_waits_for_its_retry_leaves_the_place_free(world):
    schedule = schedule_with("bufferOne", retry_policy=RETRY)
    first, second, third = due_now(schedule, 0, 1, 2)
    start(first)
    start(second)
    finish(first)
    assert start(second) == {second.pk}
    finish(second, FAILED)
    retry_at = fresh(second).due_at
    assert start(third) == set() and fresh(third).overlap_state == "buffered"  # not skipped
    # And no release pulls its retry forward.
    (other,) = due_now(schedule, 3)
    ServiceCall.objects.filter(pk=other.pk).update(overlap="allowAll")
    start(other)
    finish(other)
    assert fresh(second).due_at == retry_at


def test_the_end_of_a_call_made_under_another_policy_releases_the_one_waiting(world):
    schedule = schedule_with("skip")
    (first,) = due_now(schedule, 0)
    start(first)
    assert ApiClient(world.acme_key).patch(schedule_url(schedule.pk), {"overlap": "bufferOne"}).status_code == 200
    (second,) = due_now(Schedule.objects.get(pk=schedule.pk), 1)
    assert start(second) == set() and fresh(second).overlap_state == "buffered"
    finish(first)
    assert fresh(second).due_at <= utcnow()
    assert start(second) == {second.pk}


def test_a_call_flow_control_held_ends_that_wait_when_it_waits_for_its_schedule(world):
    from orchestration.admission import flow_round
    from tests.support.factories import make_call, make_flow_control

    make_flow_control("acme", parallelism=1)
    other = make_call("acme")
    ServiceCall.objects.filter(pk=other.pk).update(due_at=utcnow())
    assert service_calls_start(keys=[CallKey("acme", other.pk)])  # takes the one place
    first, second = due_now(schedule_with("bufferOne"), 0, 1)
    assert start(first) == set() and start(second) == set()
    assert fresh(second).held_since is not None
    make_flow_control("acme", parallelism=3)
    assert start(first) == {first.pk}
    assert start(second) == set()
    waiting = fresh(second)
    assert waiting.overlap_state == "buffered" and waiting.held_since is None and waiting.held_ms >= 0
    assert all(second.pk not in keys for _, keys in flow_round(batch=50).starts)


def test_a_change_plans_the_occurrences_to_come_and_a_pause_cancels_all_that_waits(world):
    api = ApiClient(world.acme_key)
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", overlap="bufferOne")
    first, second = due_now(schedule, 0, 1)
    start(first)
    assert start(second) == set() and fresh(second).overlap_state == "buffered"
    assert api.patch(schedule_url(schedule.pk), {"tags": ["changed"]}).status_code == 200
    assert fresh(second).status == "Scheduled"  # a past occurrence's call runs as made
    assert api.patch(schedule_url(schedule.pk), {"paused": True}).status_code == 200
    assert fresh(second).status == "Cancelled"  # nothing runs while paused


def test_due_order_wins_so_a_later_occurrence_due_first_is_not_stalled(world):
    """Jitter (or a backfill) can make a later occurrence due before an earlier one: the backlog
    takes them in due order, one at a time, and each start decides."""
    schedule = schedule_with("skip")
    early, late = due_now(schedule, 0, 1)
    now = utcnow()
    ServiceCall.objects.filter(pk=late.pk).update(due_at=now - timedelta(seconds=2))
    ServiceCall.objects.filter(pk=early.pk).update(due_at=now - timedelta(seconds=1))
    started = [call.service_call_id for call in service_calls_start_overdue(due_before=utcnow(), limit=1)]
    assert started == [late.pk]
    assert service_calls_start_overdue(due_before=utcnow(), limit=1) == []
    assert fresh(early).overlap_state == "skipped"


def test_metrics_and_list_schedules_count_as_the_api(world):
    from schedules.services import schedule_delete
    from tests.commands.cli import call

    schedule = schedule_with("skip")
    first, second = due_now(schedule, 0, 1)
    start(first)
    start(second)
    assert skipped_of(Schedule.objects.get(pk=schedule.pk))[0] == 1
    line = next(line for line in call("list_schedules", "--tenant=acme").out.splitlines() if str(schedule.pk) in line)
    assert line.split()[-1] == "1", line
    assert skipped_occurrences_by_reason()["overlap"] == 1
    finish(first)
    schedule_delete(tenant_id="acme", schedule_id=schedule.pk)
    assert skipped_occurrences_by_reason()["overlap"] == 0  # a deleted schedule takes its own along


def _second_skip_locked():
    seen = []

    def before(sql):
        if "SKIP LOCKED" in sql:
            seen.append(sql)
            return len(seen) == 2
        return False

    return before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("policy", ["bufferOne", "skip"])
def test_on_postgres_a_finish_committed_while_a_start_reads_is_seen(world, policy):
    """The start stops after its first read of the siblings (the first call Running) while the
    first call's finish commits: the locking read sees it ended, so the call starts."""
    first, second = due_now(schedule_with(policy), 0, 1)
    assert start(first) == {first.pk}
    with paused_in_another_connection(lambda: start(second), before=_second_skip_locked()) as outcome:
        finish(first)
    assert outcome == [{second.pk}], outcome
    assert (fresh(second).status, fresh(second).overlap_state) == ("Running", "")
