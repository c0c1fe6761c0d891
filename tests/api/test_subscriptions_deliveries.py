"""GET /subscriptions/{id}/deliveries: a subscription's notifications newest first with their
attempts, cursor-paged, filtered by state."""

from __future__ import annotations

import pytest

from delivery.models import Notification
from tests.support.api import assert_problem
from tests.support.factories import make_call
from tests.support.subscriptions import fan_out, make_subscription, record_try, subscription_url


@pytest.fixture
def deliveries(world, settings):
    """acme's subscription with 6 notifications (3 calls × 2 events), newest last: the first call's
    are SUCCEEDED (after a 500) and EXPIRED, the rest PENDING; another subscription has its own."""
    settings.EVENT_DELIVERY_SCHEDULE = [5]
    subscription, _ = make_subscription("acme", name="mine")
    make_subscription("acme", name="other")
    rows = []
    for i in range(3):
        rows += [n for n in fan_out(make_call("acme", name=f"call {i}").pk) if n.subscription_id == subscription.pk]
    record_try(rows[0], succeeded=False, status_code=500, response_snippet="oops", error="HTTP 500")
    record_try(rows[0], succeeded=True, status_code=204)
    record_try(rows[1], succeeded=False, error="connection refused")
    record_try(rows[1], succeeded=False, error="connection refused")  # past the schedule: EXPIRED
    return subscription, rows


def test_it_lists_deliveries_newest_first_with_their_attempts(acme_api, deliveries):
    subscription, rows = deliveries

    response = acme_api.get(subscription_url(subscription.pk, suffix="/deliveries"))

    assert response.status_code == 200, response.content
    body = response.json()
    assert [d["notificationId"] for d in body["results"]] == [str(n.pk) for n in reversed(rows)]
    assert body["next"] is None and body["previous"] is None
    by_id = {d["notificationId"]: d for d in body["results"]}
    first = by_id[str(rows[0].pk)]
    assert first["state"] == "SUCCEEDED" and first["attempts"] == 2 and first["deliveredAt"].endswith("Z")
    assert first["eventType"] == "ServiceCallSubmitted" and first["aggregateId"] == str(rows[0].aggregate_id)
    assert first["deliveryAttempts"] == [
        {
            "n": 1,
            "trigger": "scheduled",
            "startedAt": first["deliveryAttempts"][0]["startedAt"],
            "latencyMs": 7,
            "statusCode": 500,
            "responseSnippet": "oops",
            "error": "HTTP 500",
        },
        {
            "n": 2,
            "trigger": "scheduled",
            "startedAt": first["deliveryAttempts"][1]["startedAt"],
            "latencyMs": 7,
            "statusCode": 204,
            "responseSnippet": None,
            "error": None,
        },
    ]
    expired = by_id[str(rows[1].pk)]
    assert expired["state"] == "EXPIRED" and expired["lastError"] == "connection refused"
    assert [a["error"] for a in expired["deliveryAttempts"]] == ["connection refused"] * 2
    assert by_id[str(rows[5].pk)]["deliveryAttempts"] == [] and by_id[str(rows[5].pk)]["state"] == "PENDING"


def test_it_pages_with_a_cursor(acme_api, deliveries):
    subscription, rows = deliveries
    url = subscription_url(subscription.pk, suffix="/deliveries")

    page1 = acme_api.get(url, {"limit": 4}).json()
    page2 = acme_api.get(page1["next"]).json()

    assert [d["notificationId"] for d in page1["results"] + page2["results"]] == [str(n.pk) for n in reversed(rows)]
    assert len(page1["results"]) == 4 and page1["previous"] is None
    assert page2["next"] is None and page2["previous"] is not None
    back = acme_api.get(page2["previous"]).json()
    assert [d["notificationId"] for d in back["results"]] == [d["notificationId"] for d in page1["results"]]


@pytest.mark.parametrize(
    ("state", "indexes"),
    [("SUCCEEDED", [0]), ("EXPIRED", [1]), ("PENDING", [5, 4, 3, 2]), ("FAILED", []), ("", [5, 4, 3, 2, 1, 0])],
)
def test_it_filters_by_state(acme_api, deliveries, state, indexes):
    subscription, rows = deliveries
    body = acme_api.get(subscription_url(subscription.pk, suffix="/deliveries"), {"state": state}).json()
    assert [d["notificationId"] for d in body["results"]] == [str(rows[i].pk) for i in indexes]


def test_the_state_filter_pages_too(acme_api, deliveries):
    subscription, rows = deliveries
    url = subscription_url(subscription.pk, suffix="/deliveries")
    page1 = acme_api.get(url, {"state": "PENDING", "limit": 3}).json()
    assert "state=PENDING" in page1["next"]
    page2 = acme_api.get(page1["next"]).json()
    assert [d["notificationId"] for d in page2["results"]] == [str(rows[2].pk)]


def test_a_failed_delivery_shows_when_it_is_tried_next(acme_api, world):
    subscription, _ = make_subscription("acme")
    [first, _] = fan_out(make_call("acme").pk)
    failed = record_try(first, succeeded=False, status_code=503)
    body = acme_api.get(subscription_url(subscription.pk, suffix="/deliveries"), {"state": "FAILED"}).json()
    [shown] = body["results"]
    assert shown["state"] == "FAILED" and shown["nextAttemptAt"] is not None
    assert failed.state == Notification.State.FAILED


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "DONE"}, "state"),
        ({"state": "pending"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"cursor": "!!"}, "cursor"),
    ],
)
def test_bad_parameters_are_400(acme_api, deliveries, params, field):
    subscription, _ = deliveries
    body = assert_problem(
        acme_api.get(subscription_url(subscription.pk, suffix="/deliveries"), params), 400, errors_for=field
    )
    if field == "state":
        assert "PENDING, SUCCEEDED, FAILED, EXPIRED" in body["errors"]["state"][0]


def test_another_subscriptions_or_tenants_deliveries_are_not_shown(acme_api, world):
    mine, _ = make_subscription("acme")
    globex, _ = make_subscription("globex")
    make_subscription(None)
    fan_out(make_call("globex").pk)

    assert acme_api.get(subscription_url(mine.pk, suffix="/deliveries")).json()["results"] == []
    assert_problem(acme_api.get(subscription_url(globex.pk, suffix="/deliveries")), 404)
