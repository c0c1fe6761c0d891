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


def test_one_outcome_that_cannot_be_recorded_does_not_sink_the_others(transactional_db, world, monkeypatch):
    """The recorder writes outcomes in batches (one transaction); when a batch fails it records
    each alone, so one bad outcome (another tenant's, say) leaves the others recorded."""
    from execution.outcomes import Outcome
    from orchestration.services import CallKey
    from workers.engine import Engine
    from workers.keeper import SessionKeeper
    from workers.loops import recorder as recorder_module
    from workers.pipeline import record as real_record
    from workers.pipeline import start_and_claim

    calls = [make_call("acme" if n % 2 else "globex", name=f"c{n}") for n in range(4)]
    keeper = SessionKeeper()
    engine = Engine(keeper)
    try:
        attempts = start_and_claim([CallKey(c.tenant_id, c.pk) for c in calls], worker_id=keeper.session_id)
        poisoned = attempts[1].order.service_call_id

        def record(batch):
            if any(attempt.order.service_call_id == poisoned for attempt, _ in batch):
                raise ValueError("this outcome cannot be recorded")
            real_record(batch)

        monkeypatch.setattr(recorder_module, "record", record)
        monkeypatch.setattr(recorder_module.time, "sleep", lambda seconds: None)
        engine.loops["recorder"].record_batch([(attempt, Outcome(succeeded=True, status=200)) for attempt in attempts])
    finally:
        engine.pool.shutdown(wait=False)
        keeper.close()
    statuses = {c.pk: ServiceCall.objects.get(pk=c.pk).status for c in calls}
    assert statuses.pop(poisoned) == "Running"  # left to the watchdog
    assert set(statuses.values()) == {"Succeeded"}
