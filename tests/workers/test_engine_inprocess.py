"""The engine in this process against a real HTTP server: the whole flow of a call."""

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.factories import make_call
from tests.support.waiting import wait_for


def _terminal(call):
    fresh = ServiceCall.objects.get(pk=call.pk)
    return fresh if fresh.is_terminal else None


def test_a_due_call_succeeds_with_its_four_events_published_in_order(world, http_target, engine):
    call = make_call("acme", url=http_target.url("/json"), due_in=1)
    done = wait_for(lambda: _terminal(call))
    assert done.status == ServiceCall.Status.SUCCEEDED
    assert done.started_at >= done.due_at
    assert done.outcome_meta["responseMeta"]["status"] == 200
    assert '"hello"' in done.outcome_meta["responseMeta"]["bodySnippet"]
    wait_for(lambda: not OutboxEvent.objects.filter(aggregate_id=call.pk, published_at__isnull=True).exists())
    events = list(OutboxEvent.objects.filter(aggregate_id=call.pk).order_by("id"))
    assert [e.event_type for e in events] == [
        "ServiceCallSubmitted",
        "ServiceCallScheduled",
        "ServiceCallRunning",
        "ServiceCallSucceeded",
    ]
    published = [e.published_at for e in events]
    assert published == sorted(published)
    assert http_target.count("/json") == 1


def test_non_2xx_refused_and_timeout_get_their_error_kinds(world, http_target, engine):
    http_error = make_call("acme", url=http_target.url("/status/503"))
    refused = make_call("acme", url="http://127.0.0.1:9/")
    slow = make_call("acme", url=http_target.url("/delay/3000"), timeout_ms=300)
    assert wait_for(lambda: _terminal(http_error)).error_kind == "HttpError"
    assert ServiceCall.objects.get(pk=http_error.pk).outcome_meta["errorMeta"]["status"] == 503
    assert wait_for(lambda: _terminal(refused)).error_kind == "NetworkError"
    assert wait_for(lambda: _terminal(slow)).error_kind == "Timeout"


def _record_claimed(calls, record, monkeypatch) -> list:
    """The calls started and claimed by an engine of this process, and their outcomes (all 200)
    given to its recorder in one batch, with `record` in place of the write; returns the
    attempts."""
    from execution.outcomes import Outcome
    from orchestration.services import CallKey
    from workers.engine import Engine
    from workers.keeper import SessionKeeper
    from workers.loops import recorder as recorder_module
    from workers.pipeline import start_and_claim

    keeper = SessionKeeper()
    engine = Engine(keeper)
    try:
        attempts = start_and_claim([CallKey(c.tenant_id, c.pk) for c in calls], worker_id=keeper.session_id)
        monkeypatch.setattr(recorder_module, "record", lambda batch: record(batch, attempts))
        monkeypatch.setattr(recorder_module.time, "sleep", lambda seconds: None)
        engine.loops["recorder"].record_batch([(attempt, Outcome(succeeded=True, status=200)) for attempt in attempts])
    finally:
        engine.pool.shutdown(wait=False)
        keeper.close()
    return attempts


def test_one_outcome_that_cannot_be_recorded_does_not_sink_the_others(transactional_db, world, monkeypatch):
    """The recorder writes outcomes in batches (one transaction); when a batch fails it records
    each alone, so one bad outcome (another tenant's, say) leaves the others recorded."""
    from workers.pipeline import record as real_record

    calls = [make_call("acme" if n % 2 else "globex", name=f"c{n}") for n in range(4)]

    def record(batch, attempts):
        if any(attempt.order.service_call_id == attempts[1].order.service_call_id for attempt, _ in batch):
            raise ValueError("this outcome cannot be recorded")
        real_record(batch)

    poisoned = _record_claimed(calls, record, monkeypatch)[1].order.service_call_id
    statuses = {c.pk: ServiceCall.objects.get(pk=c.pk).status for c in calls}
    assert statuses.pop(poisoned) == "Running"  # left to the watchdog
    assert set(statuses.values()) == {"Succeeded"}


def test_while_the_database_is_unreachable_a_batch_is_written_again_whole(transactional_db, world, monkeypatch):
    """A failover (docs/deploy.md, "High availability"): the recorder writes the same batch again,
    past its five tries for other errors, and does not split it into one transaction each."""
    from django.db import OperationalError

    from workers.pipeline import record as real_record

    calls = [make_call("acme", name=f"c{n}") for n in range(3)]
    written: list[int] = []

    def record(batch, attempts):
        if len(written) < 7:  # the server gone for seven tries
            written.append(0)
            raise OperationalError("connection failed: server closed the connection unexpectedly")
        written.append(len(batch))
        real_record(batch)

    _record_claimed(calls, record, monkeypatch)
    assert written == [0] * 7 + [3]
    assert {ServiceCall.objects.get(pk=c.pk).status for c in calls} == {"Succeeded"}
