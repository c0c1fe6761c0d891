"""POST /subscriptions/{id}/rotate-secret, /test and /recover, and POST /deliveries/{id}/resend:
each answers and changes the rows it says."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta, timezone

import pytest

from core.ids import iso_ms, utcnow
from core.secrets import unseal_value
from delivery.models import Notification, Subscription
from delivery.services import PING_TYPE
from tests.support.api import assert_problem
from tests.support.factories import make_call
from tests.support.subscriptions import fan_out, make_subscription, record_try, resend_url, subscription_url

UNKNOWN = "0190a000-0000-7000-8000-000000000000"


@pytest.fixture
def no_retries(settings):
    """A failed try is final: the notification is EXPIRED at once."""
    settings.EVENT_DELIVERY_SCHEDULE = []


# --- rotate-secret --------------------------------------------------------------------------------


def test_rotate_answers_a_new_secret_once_and_the_old_one_signs_24_hours_more(acme_api, world):
    subscription, old_secret = make_subscription("acme")

    response = acme_api.post(subscription_url(subscription.pk, suffix="/rotate-secret"))

    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"secret"}
    new_secret = body["secret"]
    assert new_secret != old_secret and new_secret.startswith("whsec_")
    assert len(base64.b64decode(new_secret[6:])) == 32
    stored = Subscription.objects.get(pk=subscription.pk)
    assert unseal_value(stored.secret) == new_secret
    assert unseal_value(stored.previous_secret) == old_secret
    overlap = stored.previous_secret_until - utcnow()
    assert timedelta(hours=23, minutes=59) < overlap <= timedelta(hours=24)
    shown = acme_api.get(subscription_url(subscription.pk)).content.decode()
    assert new_secret not in shown and old_secret not in shown


def test_rotating_twice_gives_two_different_secrets(acme_api, world):
    subscription, _ = make_subscription("acme")
    url = subscription_url(subscription.pk, suffix="/rotate-secret")
    assert acme_api.post(url).json()["secret"] != acme_api.post(url).json()["secret"]


# --- test -----------------------------------------------------------------------------------------


def test_send_test_queues_a_ping_for_this_subscription_alone(acme_api, world):
    subscription, _ = make_subscription("acme")
    other, _ = make_subscription("acme", name="other")

    response = acme_api.post(subscription_url(subscription.pk, suffix="/test"))

    assert response.status_code == 202, response.content
    body = response.json()
    stored = Notification.objects.get()
    assert body["notificationId"] == str(stored.pk)
    assert body["subscriptionId"] == str(subscription.pk) and body["eventType"] == PING_TYPE
    assert body["state"] == "PENDING" and body["attempts"] == 0 and body["deliveryAttempts"] == []
    assert body["links"]["resend"].endswith(f"/api/tenants/acme/deliveries/{stored.pk}/resend")
    assert stored.subscription_id == subscription.pk and stored.event_type == PING_TYPE
    assert stored.state == Notification.State.PENDING and stored.manual is True
    assert stored.next_attempt_at <= utcnow()
    assert not Notification.objects.filter(subscription=other).exists()


# --- recover --------------------------------------------------------------------------------------


def test_recover_requeues_failed_and_expired_deliveries_since_a_time(acme_api, world, no_retries):
    subscription, _ = make_subscription("acme")
    call = make_call("acme")
    submitted, scheduled = fan_out(call.pk)
    expired = record_try(submitted, succeeded=False, status_code=500, error="HTTP 500")
    succeeded = record_try(scheduled, succeeded=True, status_code=200)
    assert expired.state == Notification.State.EXPIRED and succeeded.state == Notification.State.SUCCEEDED
    since = iso_ms(expired.event_created_at - timedelta(seconds=1))

    response = acme_api.post(subscription_url(subscription.pk, suffix="/recover"), {"since": since})

    assert response.status_code == 200, response.content
    assert response.json() == {"requeued": 1}
    again = Notification.objects.get(pk=expired.pk)
    assert again.state == Notification.State.PENDING and again.step == 0 and again.manual is True
    assert again.next_attempt_at <= utcnow()
    assert Notification.objects.get(pk=succeeded.pk).state == Notification.State.SUCCEEDED


def test_recover_leaves_deliveries_of_earlier_events_alone(acme_api, world, no_retries):
    subscription, _ = make_subscription("acme")
    call = make_call("acme")
    [first, _] = fan_out(call.pk)
    expired = record_try(first, succeeded=False, status_code=500)
    Notification.objects.filter(pk=expired.pk).update(event_created_at=utcnow() - timedelta(hours=2))

    since = iso_ms(utcnow() - timedelta(hours=1))
    response = acme_api.post(subscription_url(subscription.pk, suffix="/recover"), {"since": since})

    assert response.json() == {"requeued": 0}
    assert Notification.objects.get(pk=expired.pk).state == Notification.State.EXPIRED


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "since"),
        ({"since": None}, "since"),
        ({"since": ""}, "since"),
        ({"since": 1700000000}, "since"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2024-01-01T00:00:00"}, "since"),  # no time zone
        ({"since": "2024-02-30T00:00:00Z"}, "since"),
        ({"since": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}, "since"),
        ({"since": "9999-12-31T23:59:59-14:00"}, "since"),
        ({"since": "2024-01-01T00:00:00Z", "extra": 1}, "body"),
        (["2024-01-01T00:00:00Z"], "body"),
    ],
)
def test_recover_refuses_a_bad_since_and_changes_nothing(acme_api, world, no_retries, payload, field):
    subscription, _ = make_subscription("acme")
    [first, _] = fan_out(make_call("acme").pk)
    record_try(first, succeeded=False, status_code=500)

    response = acme_api.post(subscription_url(subscription.pk, suffix="/recover"), payload)

    assert_problem(response, 400, errors_for=field)
    assert Notification.objects.get(pk=first.pk).state == Notification.State.EXPIRED


def test_recover_takes_an_offset(acme_api, world, no_retries):
    subscription, _ = make_subscription("acme")
    [first, _] = fan_out(make_call("acme").pk)
    record_try(first, succeeded=False, status_code=500)
    since = (utcnow() - timedelta(hours=1)).astimezone(timezone(timedelta(hours=2))).isoformat()

    response = acme_api.post(subscription_url(subscription.pk, suffix="/recover"), {"since": since})

    assert response.json() == {"requeued": 1}


# --- resend ---------------------------------------------------------------------------------------


def test_resend_tries_a_delivery_again_now_whatever_its_state(acme_api, world):
    make_subscription("acme")
    [first, second] = fan_out(make_call("acme").pk)
    delivered = record_try(first, succeeded=True, status_code=200)
    failed = record_try(second, succeeded=False, status_code=503, error="HTTP 503")
    assert failed.next_attempt_at > utcnow()

    for notification in (delivered, failed):
        response = acme_api.post(resend_url(notification.pk))

        assert response.status_code == 202, response.content
        body = response.json()
        assert body["notificationId"] == str(notification.pk)
        assert body["state"] == "PENDING" and body["attempts"] == 1
        assert len(body["deliveryAttempts"]) == 1
        stored = Notification.objects.get(pk=notification.pk)
        assert stored.state == Notification.State.PENDING and stored.manual is True and stored.step == 0
        assert stored.next_attempt_at <= utcnow()


def test_resend_of_an_unknown_foreign_or_operator_wide_delivery_is_404(acme_api, world):
    make_subscription("globex")
    make_subscription(None)
    notifications = fan_out(make_call("globex").pk)
    assert len(notifications) == 4  # globex's own and the operator-wide one, two events each
    for notification_id in (UNKNOWN, "nope", *(str(n.pk) for n in notifications)):
        assert_problem(acme_api.post(resend_url(notification_id)), 404)
    assert {n.state for n in Notification.objects.all()} == {Notification.State.PENDING}
    assert not Notification.objects.filter(manual=True).exists()


@pytest.mark.parametrize("suffix", ["/rotate-secret", "/test", "/recover"])
def test_operations_on_an_unknown_or_malformed_subscription_are_404(acme_api, world, suffix):
    for subscription_id in (UNKNOWN, "nope"):
        payload = {"since": "2024-01-01T00:00:00Z"} if suffix == "/recover" else None
        assert_problem(acme_api.post(subscription_url(subscription_id, suffix=suffix), payload), 404)
    assert not Notification.objects.exists()


def test_the_rotate_answer_that_carries_the_secret_is_kept_by_no_cache(acme_api, world):
    subscription, _ = make_subscription("acme")
    response = acme_api.post(subscription_url(subscription.pk, suffix="/rotate-secret"))
    assert response.status_code == 200 and response.json()["secret"].startswith("whsec_")
    assert response["Cache-Control"] == "no-store"
