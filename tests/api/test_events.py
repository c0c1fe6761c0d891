"""GET /api/tenants/{tenantId}/events: the tenant's published events, oldest first."""

from __future__ import annotations

from datetime import timedelta

from core.ids import utcnow
from outbox.dispatcher import dispatch_batch
from outbox.models import OutboxEvent
from outbox.sinks import LogSink
from tests.api.conftest import assert_problem, submit

URL = "/api/tenants/{tenant}/events"


def _publish_all() -> int:
    return dispatch_batch(limit=1000, sinks=[LogSink()])


def _types(body) -> list[str]:
    return [event["type"] for event in body["results"]]


def test_it_tails_published_events_oldest_first_with_sequence_and_published_at(acme_api, globex_api):
    first = submit(acme_api, name="one")["serviceCallId"]
    second = submit(acme_api, name="two")["serviceCallId"]
    submit(globex_api, "globex", name="theirs")
    _publish_all()

    body = acme_api.get(URL.format(tenant="acme")).json()

    rows = list(OutboxEvent.objects.filter(tenant_id="acme").order_by("id"))
    assert [e["sequence"] for e in body["results"]] == [row.id for row in rows]
    assert [e["aggregateId"] for e in body["results"]] == [first, first, second, second]
    assert _types(body) == ["ServiceCallSubmitted", "ServiceCallScheduled"] * 2
    assert all(e["tenantId"] == "acme" and e["publishedAt"].endswith("Z") for e in body["results"])
    event = body["results"][0]
    assert set(event) >= {
        "id",
        "type",
        "tenantId",
        "aggregateId",
        "timestampMs",
        "correlationId",
        "causationId",
        "payload",
        "sequence",
        "publishedAt",
    }


def test_unpublished_events_are_not_served(acme_api):
    submit(acme_api)
    assert acme_api.get(URL.format(tenant="acme")).json()["results"] == []


def test_after_a_sequence_or_an_envelope_id_resumes_behind_it(acme_api):
    submit(acme_api, name="one")
    submit(acme_api, name="two")
    _publish_all()
    everything = acme_api.get(URL.format(tenant="acme")).json()["results"]

    by_sequence = acme_api.get(URL.format(tenant="acme"), {"after": everything[1]["sequence"]}).json()
    by_id = acme_api.get(URL.format(tenant="acme"), {"after": everything[1]["id"]}).json()

    assert by_sequence["results"] == everything[2:]
    assert by_id["results"] == everything[2:]


def test_next_polls_for_what_comes_after_the_page(acme_api):
    submit(acme_api, name="one")
    _publish_all()
    page = acme_api.get(URL.format(tenant="acme"), {"limit": 1}).json()
    assert len(page["results"]) == 1 and page["next"].startswith("http://testserver/api/tenants/acme/events?")

    second = acme_api.get(page["next"]).json()
    assert _types(second) == ["ServiceCallScheduled"]
    empty = acme_api.get(second["next"]).json()
    assert empty["results"] == [] and f"after={second['results'][0]['sequence']}" in empty["next"]

    submit(acme_api, name="two")
    _publish_all()
    assert _types(acme_api.get(empty["next"]).json()) == ["ServiceCallSubmitted"]


def test_a_fresh_unpublished_event_holds_back_later_ones_so_none_is_skipped(acme_api):
    first = submit(acme_api, name="one")["serviceCallId"]
    submit(acme_api, name="two")
    # Publish only the second call's events, as a dispatcher would while the first waits.
    OutboxEvent.objects.exclude(aggregate_id=first).update(published_at=utcnow())

    assert acme_api.get(URL.format(tenant="acme")).json()["results"] == []

    # Once the first call's events have been stuck past the hold, they stop holding the tail.
    OutboxEvent.objects.filter(aggregate_id=first).update(created_at=utcnow() - timedelta(minutes=5))
    body = acme_api.get(URL.format(tenant="acme")).json()
    assert [e["payload"].get("name") for e in body["results"] if e["type"] == "ServiceCallSubmitted"] == ["two"]


def test_it_refuses_bad_after_and_limit_values(acme_api, globex_api):
    submit(globex_api, "globex")
    _publish_all()
    theirs = str(OutboxEvent.objects.filter(tenant_id="globex").first().event_id)

    assert_problem(acme_api.get(URL.format(tenant="acme"), {"after": "yesterday"}), 400, errors_for="after")
    # Another tenant's event id is unknown here, not a way to read their stream.
    assert_problem(acme_api.get(URL.format(tenant="acme"), {"after": theirs}), 400, errors_for="after")
    assert_problem(acme_api.get(URL.format(tenant="acme"), {"limit": "0"}), 400, errors_for="limit")
    assert_problem(acme_api.get(URL.format(tenant="acme"), {"limit": "1001"}), 400, errors_for="limit")
