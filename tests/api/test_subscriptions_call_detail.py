"""GET /service-calls/{id}: each event lists its deliveries to the tenant's own subscriptions,
read in one query for the whole call."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.api import call_url
from tests.support.factories import make_call
from tests.support.subscriptions import fan_out, make_subscription, record_try


def test_each_event_lists_its_deliveries(acme_api, world):
    first, _ = make_subscription("acme", name="first hook")
    only_failed, _ = make_subscription("acme", name="failures", event_types=["ServiceCallFailed"])
    second, _ = make_subscription("acme", name="second hook")
    call = make_call("acme")
    notifications = fan_out(call.pk)
    submitted_to_first = next(
        n for n in notifications if n.subscription_id == first.pk and n.event_type == "ServiceCallSubmitted"
    )
    delivered = record_try(submitted_to_first, succeeded=True, status_code=200)

    body = acme_api.get(call_url(call.pk)).json()

    submitted, scheduled = body["events"]
    assert [d["subscriptionName"] for d in submitted["deliveries"]] == ["first hook", "second hook"]
    assert submitted["deliveries"][0] == {
        "notificationId": str(delivered.pk),
        "subscriptionId": str(first.pk),
        "subscriptionName": "first hook",
        "state": "SUCCEEDED",
        "attempts": 1,
        "nextAttemptAt": None,
        "deliveredAt": submitted["deliveries"][0]["deliveredAt"],
    }
    assert submitted["deliveries"][0]["deliveredAt"].endswith("Z")
    pending = submitted["deliveries"][1]
    assert pending["subscriptionId"] == str(second.pk) and pending["state"] == "PENDING"
    assert pending["attempts"] == 0 and pending["nextAttemptAt"].endswith("Z") and pending["deliveredAt"] is None
    assert [d["subscriptionId"] for d in scheduled["deliveries"]] == [str(first.pk), str(second.pk)]
    assert str(only_failed.pk) not in str(body)


def test_events_without_subscribers_have_no_deliveries(acme_api, world):
    call = make_call("acme")
    body = acme_api.get(call_url(call.pk)).json()
    assert [e["deliveries"] for e in body["events"]] == [[], []]


def test_operator_wide_and_other_tenants_subscriptions_are_not_shown(acme_api, world):
    operator, _ = make_subscription(None, name="operator-wide hook")
    make_subscription("globex", name="globex hook")
    mine, _ = make_subscription("acme", name="mine")
    call = make_call("acme")
    notifications = fan_out(call.pk)
    assert {n.subscription_id for n in notifications} == {operator.pk, mine.pk}

    body = acme_api.get(call_url(call.pk))

    assert [[d["subscriptionName"] for d in e["deliveries"]] for e in body.json()["events"]] == [["mine"], ["mine"]]
    assert "operator-wide hook" not in body.content.decode() and str(operator.pk) not in body.content.decode()


def test_the_deliveries_of_all_events_are_read_in_one_query(acme_api, world):
    for i in range(3):
        make_subscription("acme", name=f"hook {i}")
    call = make_call("acme")
    fan_out(call.pk)

    with CaptureQueriesContext(connection) as queries:
        body = acme_api.get(call_url(call.pk)).json()

    assert sum(len(e["deliveries"]) for e in body["events"]) == 6
    reads = [q["sql"] for q in queries.captured_queries if "event_notifications" in q["sql"]]
    assert len(reads) == 1, reads
