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
