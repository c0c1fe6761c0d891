"""Subscriptions filtered by tag (docs/events.md, "Subscriptions filtered by tag"): a subscription
that lists tags receives only the events of calls carrying one of them (as the call has them
when its event is fanned out), and its event types still apply; one without tags receives every
call's. Set through the API, the pages, the admin and create_subscription; bad tags are a 400
naming the field and store nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from delivery.fanout import NotificationSink
from delivery.models import Notification, Subscription
from orchestration.services import service_call_tags_set
from outbox.models import OutboxEvent
from tests.support.api import ApiClient, assert_problem
from tests.support.factories import make_call
from tests.support.subscriptions import fan_out, make_subscription, subscription_url, subscriptions_url

# The fan-out's SQL (the tags' JSON column, the tags' query) differs by database: run on both.
pytestmark = pytest.mark.also_postgres


def _subscribed(tags, **extra) -> Subscription:
    subscription, _ = make_subscription("acme", name=f"tags {tags}", url="http://127.0.0.1:9/hook", **extra)
    Subscription.objects.filter(pk=subscription.pk).update(tags=list(tags))
    return Subscription.objects.get(pk=subscription.pk)


def _received(subscription: Subscription, call) -> list[str]:
    return [n.event_type for n in fan_out(call.pk) if n.subscription_id == subscription.pk]


def test_only_the_events_of_calls_carrying_one_of_its_tags_reach_it(world):
    billing = _subscribed(["billing", "invoices"])
    everything = _subscribed([])
    tagged = make_call("acme", name="tagged", tags=["billing", "eu"])
    other = make_call("acme", name="other", tags=["reports"])
    bare = make_call("acme", name="bare")

    assert _received(billing, tagged) == ["ServiceCallSubmitted", "ServiceCallScheduled"]
    assert _received(billing, other) == [] and _received(billing, bare) == []
    assert len(_received(everything, other)) == 2 and len(_received(everything, bare)) == 2

    # Tagged afterwards: the events from then on reach it (the tag event itself included).
    service_call_tags_set(tenant_id="acme", service_call_id=other.pk, tags=["reports", "invoices"], correlation_id="t")
    tagged_event = OutboxEvent.objects.get(aggregate_id=other.pk, event_type="ServiceCallTagged")
    NotificationSink().publish_events([tagged_event])  # as the dispatcher fans out each event once
    assert [n.event_type for n in Notification.objects.filter(subscription=billing)] == [
        "ServiceCallSubmitted",
        "ServiceCallScheduled",
        "ServiceCallTagged",
    ]
    assert Notification.objects.get(subscription=billing, event_type="ServiceCallTagged").aggregate_id == other.pk


def test_event_types_still_apply_and_other_tenants_calls_never_reach_it(world):
    only_tagged = _subscribed(["billing"], event_types=["ServiceCallScheduled"])
    globex = make_call("globex", name="globex billing", tags=["billing"])
    acme = make_call("acme", name="acme billing", tags=["billing"])
    assert _received(only_tagged, acme) == ["ServiceCallScheduled"]
    assert _received(only_tagged, globex) == []


def test_the_api_takes_tags_and_refuses_bad_ones(acme_api):
    made = acme_api.post(
        subscriptions_url(), {"name": "billing hook", "url": "http://127.0.0.1:9/hook", "tags": ["billing", "billing"]}
    )
    assert made.status_code == 201, made.content
    assert made.json()["tags"] == ["billing"]
    subscription_id = made.json()["subscriptionId"]
    changed = acme_api.patch(subscription_url(subscription_id), {"tags": ["invoices", "eu"]})
    assert changed.json()["tags"] == ["invoices", "eu"]
    assert acme_api.patch(subscription_url(subscription_id), {"tags": []}).json()["tags"] == []

    for bad in ("billing", ["two words"], [""], [7], [f"t{n}" for n in range(21)], ["\u202ebad"]):
        answer = acme_api.post(subscriptions_url(), {"name": "bad", "url": "http://127.0.0.1:9/x", "tags": bad})
        assert_problem(answer, 400, errors_for="tags")
        assert_problem(acme_api.patch(subscription_url(subscription_id), {"tags": bad}), 400, errors_for="tags")
    assert Subscription.objects.count() == 1
    assert Subscription.objects.get().tags == []


def test_create_subscription_takes_tags(world):
    out = StringIO()
    call_command(
        "create_subscription",
        "--tenant",
        "acme",
        "--name",
        "cli",
        "--url",
        "http://127.0.0.1:9/hook",
        "--tag",
        "billing",
        "--tag",
        "eu",
        stdout=out,
    )
    assert "all event types of calls tagged billing or eu" in out.getvalue()
    assert Subscription.objects.get(name="cli").tags == ["billing", "eu"]


def test_the_page_and_the_admin_take_tags(world, client, admin_client):
    client.force_login(world.member)
    answer = client.post(
        "/subscriptions/new/",
        {"name": "page hook", "url": "http://127.0.0.1:9/p", "tags": "billing eu", "enabled": "on"},
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    page = Subscription.objects.get(name="page hook")
    assert page.tags == ["billing", "eu"]
    assert "billing" in client.get(f"/subscriptions/{page.pk}/").content.decode()
    refused = client.post("/subscriptions/new/", {"name": "bad", "url": "http://127.0.0.1:9/p", "tags": "\u202ebad"})
    assert refused.status_code == 400 and not Subscription.objects.filter(name="bad").exists()

    added = admin_client.post(
        "/admin/delivery/subscription/add/",
        {
            "tenant": "acme",
            "kind": "webhook",
            "name": "admin hook",
            "url": "http://127.0.0.1:9/a",
            "tags": "invoices",
            "enabled": "on",
        },
    )
    assert added.status_code == 200, added.content.decode()[:3000]
    assert Subscription.objects.get(name="admin hook").tags == ["invoices"]


@pytest.fixture
def acme_api(world) -> ApiClient:
    return ApiClient(world.acme_key)
