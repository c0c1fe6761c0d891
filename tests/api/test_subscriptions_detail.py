"""GET /subscriptions, GET|PATCH|DELETE /subscriptions/{id}: the tenant's own subscriptions,
with their health and figures."""

from __future__ import annotations

from datetime import timedelta

from core.ids import utcnow
from delivery.models import DeliveryAttempt, Notification, Subscription
from tests.support.api import assert_problem
from tests.support.factories import make_call
from tests.support.subscriptions import fan_out, make_subscription, record_try, subscription_url, subscriptions_url

UNKNOWN = "0190a000-0000-7000-8000-000000000000"


def test_the_list_shows_the_tenants_own_subscriptions_newest_first(acme_api, world):
    first, first_secret = make_subscription("acme", name="first")
    second, second_secret = make_subscription("acme", name="second", event_types=["ServiceCallFailed"])
    make_subscription("globex", name="globex hook")
    make_subscription(None, name="operator-wide hook")

    response = acme_api.get(subscriptions_url())

    assert response.status_code == 200
    body = response.json()
    assert [s["name"] for s in body["results"]] == ["second", "first"]
    assert body["next"] is None and body["previous"] is None
    assert body["results"][0]["eventTypes"] == ["ServiceCallFailed"]
    assert body["results"][1]["subscriptionId"] == str(first.pk)
    assert all("secret" not in s for s in body["results"])
    assert first_secret not in response.content.decode() and second_secret not in response.content.decode()


def test_the_list_is_cursor_paged(acme_api, world):
    made = [make_subscription("acme", name=f"hook {i}")[0] for i in range(5)]

    page1 = acme_api.get(subscriptions_url(), {"limit": 2}).json()
    page2 = acme_api.get(page1["next"]).json()
    page3 = acme_api.get(page2["next"]).json()

    names = [s["name"] for page in (page1, page2, page3) for s in page["results"]]
    assert names == [s.name for s in reversed(made)]
    assert page3["next"] is None
    back = acme_api.get(page2["previous"]).json()
    assert [s["name"] for s in back["results"]] == [s["name"] for s in page1["results"]]


def test_bad_paging_parameters_are_400(acme_api, world):
    assert_problem(acme_api.get(subscriptions_url(), {"limit": 0}), 400, errors_for="limit")
    assert_problem(acme_api.get(subscriptions_url(), {"limit": 201}), 400, errors_for="limit")
    assert_problem(acme_api.get(subscriptions_url(), {"cursor": "bogus!"}), 400, errors_for="cursor")


def test_detail_shows_health_and_figures(acme_api, world):
    subscription, _ = make_subscription("acme", name="watched")
    # A delivery of more than an hour ago does not count.
    old_call = make_call("acme", name="old")
    [old, _] = fan_out(old_call.pk)
    record_try(old, succeeded=True, status_code=200)
    Notification.objects.filter(pk=old.pk).update(delivered_at=utcnow() - timedelta(hours=2))
    call = make_call("acme")
    submitted, scheduled = fan_out(call.pk)
    record_try(submitted, succeeded=True, status_code=204)
    record_try(scheduled, succeeded=False, status_code=500, error="HTTP 500")
    # A lag of 2 s for the delivered one: its event happened 2 s before its delivery.
    delivered = Notification.objects.get(pk=submitted.pk)
    Notification.objects.filter(pk=delivered.pk).update(event_created_at=delivered.delivered_at - timedelta(seconds=2))

    body = acme_api.get(subscription_url(subscription.pk)).json()

    assert body["name"] == "watched" and body["enabled"] is True
    assert body["failingSince"] is not None and body["failingSince"].endswith("Z")
    assert body["lastSuccessAt"] is not None
    figures = body["figures"]
    assert figures["pending"] == 2  # the failed one (will retry) and old_call's second event
    assert figures["lagSample"] == 1
    assert figures["lagP50Ms"] == figures["lagP99Ms"] == 2000
    assert figures["lagWindowMinutes"] == 60


def test_an_unknown_malformed_foreign_or_operator_wide_id_is_404(acme_api, world):
    globex, _ = make_subscription("globex")
    operator, _ = make_subscription(None)
    for subscription_id in (UNKNOWN, "not-a-uuid", str(globex.pk), str(operator.pk)):
        assert_problem(acme_api.get(subscription_url(subscription_id)), 404)
        assert_problem(acme_api.patch(subscription_url(subscription_id), {"name": "x"}), 404)
        assert_problem(acme_api.delete(subscription_url(subscription_id)), 404)
    assert Subscription.objects.count() == 2
    assert Subscription.objects.get(pk=operator.pk).name == "hook"


def test_patch_changes_the_fields_given_and_nothing_else(acme_api, world):
    subscription, _ = make_subscription("acme", name="before", event_types=["ServiceCallFailed"])

    response = acme_api.patch(
        subscription_url(subscription.pk),
        {"name": "after", "url": "https://other.example.com/hook", "eventTypes": []},
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["name"] == "after" and body["url"] == "https://other.example.com/hook"
    assert body["eventTypes"] == [] and body["enabled"] is True
    stored = Subscription.objects.get(pk=subscription.pk)
    assert (stored.name, stored.url, stored.event_types, stored.enabled) == (
        "after",
        "https://other.example.com/hook",
        [],
        True,
    )
    assert stored.updated_at > subscription.updated_at
    assert stored.secret == subscription.secret


def test_patch_disables_with_a_reason_and_enables_again(acme_api, world):
    subscription, _ = make_subscription("acme")
    Subscription.objects.filter(pk=subscription.pk).update(failing_since=utcnow())

    off = acme_api.patch(subscription_url(subscription.pk), {"enabled": False}).json()
    assert off["enabled"] is False and off["disabledReason"]
    assert Subscription.objects.get(pk=subscription.pk).enabled is False

    on = acme_api.patch(subscription_url(subscription.pk), {"enabled": True}).json()
    assert on["enabled"] is True and on["disabledReason"] is None and on["failingSince"] is None
    stored = Subscription.objects.get(pk=subscription.pk)
    assert stored.enabled is True and stored.disabled_reason == "" and stored.failing_since is None


def test_patch_refuses_bad_input_and_changes_nothing(acme_api, world):
    subscription, _ = make_subscription("acme", name="kept")
    for payload, field in [
        ({"kind": "nats"}, "kind"),
        ({"kind": "webhook"}, "kind"),
        ({"url": "http://10.0.0.1/"}, "url"),
        ({"url": ""}, "url"),
        ({"name": ""}, "name"),
        ({"name": "n" * 201}, "name"),
        ({"eventTypes": ["Nope"]}, "eventTypes"),
        ({"enabled": 1}, "enabled"),
        ({"secret": "whsec_x"}, "secret"),
    ]:
        assert_problem(acme_api.patch(subscription_url(subscription.pk), payload), 400, errors_for=field)
    stored = Subscription.objects.get(pk=subscription.pk)
    assert (stored.name, stored.url, stored.updated_at) == ("kept", subscription.url, subscription.updated_at)


def test_delete_removes_it_with_its_deliveries(acme_api, world):
    subscription, _ = make_subscription("acme")
    kept, _ = make_subscription("acme", name="kept")
    call = make_call("acme")
    notifications = fan_out(call.pk)
    record_try(notifications[0], succeeded=False, status_code=500)

    response = acme_api.delete(subscription_url(subscription.pk))

    assert response.status_code == 204 and response.content == b""
    assert not Subscription.objects.filter(pk=subscription.pk).exists()
    assert not Notification.objects.filter(subscription_id=subscription.pk).exists()
    assert not DeliveryAttempt.objects.filter(notification__subscription_id=subscription.pk).exists()
    assert Notification.objects.filter(subscription=kept).count() == 2
    assert_problem(acme_api.get(subscription_url(subscription.pk)), 404)
