"""A subscription's actions on its page: enable/disable, rotate the secret (shown once), send a
test event, recover since a time, delete after a confirmation, resend one delivery. Each is a
POST with the CSRF token; another tenant's ids answer 404 and change nothing."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from core.secrets import unseal_value
from delivery.models import Notification, Subscription
from delivery.services import PING_TYPE
from tests.support.factories import HOUR, make_call
from tests.support.subscriptions import fan_out, make_subscription, record_try

SECRET = re.compile(r'id="new-secret">(whsec_[A-Za-z0-9+/=]+)<')


def _url(subscription, action: str = "") -> str:
    return f"/subscriptions/{subscription.pk}/{action}"


def _messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def _failed_deliveries(subscription, *, settings) -> list[Notification]:
    """A call's two events fanned out to the subscription, each tried once in vain (EXPIRED with
    a one-step schedule after a second failure)."""
    settings.EVENT_DELIVERY_SCHEDULE = [300.0]
    fan_out(make_call("acme", name="c", due_in=HOUR).pk)
    rows = list(Notification.objects.filter(subscription=subscription).order_by("event_seq"))
    for row in rows:
        record_try(row, succeeded=False, status_code=500)
    record_try(rows[1], succeeded=False, status_code=500)
    return [Notification.objects.get(pk=row.pk) for row in rows]


def test_disable_then_enable(owner_client, world):
    subscription, _ = make_subscription("acme")

    response = owner_client.post(_url(subscription, "enabled"), {"enabled": "false"}, follow=True)
    subscription.refresh_from_db()
    assert not subscription.enabled and subscription.disabled_reason == "disabled by a user"
    assert "Subscription disabled" in _messages(response)[0]
    assert '<button type="submit" class="btn btn-primary">Enable</button>' in response.content.decode()

    owner_client.post(_url(subscription, "enabled"), {"enabled": "true"})
    subscription.refresh_from_db()
    assert subscription.enabled and subscription.disabled_reason == ""


def test_an_unreadable_enable_choice_changes_nothing(owner_client, world):
    subscription, _ = make_subscription("acme")
    response = owner_client.post(_url(subscription, "enabled"), {"enabled": "maybe"}, follow=True)
    assert "Choose to enable or to disable" in _messages(response)[0]
    assert Subscription.objects.get(pk=subscription.pk).enabled


def test_rotating_the_secret_shows_the_new_one_once_and_the_old_one_keeps_signing(owner_client, world):
    subscription, old_secret = make_subscription("acme")

    response = owner_client.post(_url(subscription, "rotate-secret"))

    assert response.status_code == 302 and response["Location"] == _url(subscription)
    page = owner_client.get(response["Location"])
    assert "no-store" in page["Cache-Control"]  # the page that carries the secret
    html = page.content.decode()
    [new_secret] = SECRET.findall(html)
    subscription.refresh_from_db()
    assert new_secret != old_secret
    assert unseal_value(subscription.secret) == new_secret
    assert unseal_value(subscription.previous_secret) == old_secret
    assert "the previous secret signs too until" in html
    assert new_secret not in owner_client.get(_url(subscription)).content.decode()


def test_send_test_event_queues_a_ping_for_this_subscription_alone(owner_client, world):
    subscription, _ = make_subscription("acme")
    other, _ = make_subscription("acme", name="other")

    response = owner_client.post(_url(subscription, "test"), follow=True)

    [ping] = Notification.objects.filter(event_type=PING_TYPE)
    assert ping.subscription_id == subscription.pk and ping.manual
    assert not other.notifications.exists()
    assert "test event" in _messages(response)[0]
    assert "ServiceAgentPing" in response.content.decode()


def test_recover_requeues_failed_and_expired_deliveries_since_the_chosen_time(owner_client, world, settings):
    subscription, _ = make_subscription("acme")
    failed, expired = _failed_deliveries(subscription, settings=settings)
    assert (failed.state, expired.state) == (Notification.State.FAILED, Notification.State.EXPIRED)
    since = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()

    response = owner_client.post(_url(subscription, "recover"), {"since": since, "since_local": "x"}, follow=True)

    assert "2 failed or expired deliveries requeued." in _messages(response)
    for row in (failed, expired):
        row.refresh_from_db()
        assert row.state == Notification.State.PENDING and row.manual and row.step == 0


def test_recover_reads_a_local_time_with_the_browsers_offset(owner_client, world, settings):
    subscription, _ = make_subscription("acme")
    _failed_deliveries(subscription, settings=settings)
    # UTC+2 (offset -120): the local time 10 minutes from now there is in the future in UTC too.
    local = (datetime.now(UTC) + timedelta(hours=2, minutes=10)).strftime("%Y-%m-%dT%H:%M")

    response = owner_client.post(
        _url(subscription, "recover"), {"since_local": local, "tz_offset": "-120"}, follow=True
    )

    assert "0 failed or expired deliveries requeued." in _messages(response)
    assert not subscription.notifications.filter(state=Notification.State.PENDING).exists()


def test_recover_without_a_time_says_so_and_changes_nothing(owner_client, world, settings):
    subscription, _ = make_subscription("acme")
    _failed_deliveries(subscription, settings=settings)
    response = owner_client.post(_url(subscription, "recover"), {"since_local": ""}, follow=True)
    assert "Choose the time to recover from." in _messages(response)
    assert not subscription.notifications.filter(state=Notification.State.PENDING).exists()


def test_delete_asks_first_then_deletes_it_with_its_deliveries(owner_client, world):
    subscription, _ = make_subscription("acme", name="Old hook")
    fan_out(make_call("acme", name="c", due_in=HOUR).pk)

    confirm = owner_client.get(_url(subscription, "delete"))
    assert confirm.status_code == 200
    assert "Delete “Old hook”?" in confirm.content.decode()
    assert Subscription.objects.filter(pk=subscription.pk).exists()

    response = owner_client.post(_url(subscription, "delete"), follow=True)
    assert response.redirect_chain[-1][0] == "/subscriptions/"
    assert "Subscription “Old hook” deleted." in _messages(response)
    assert not Subscription.objects.filter(pk=subscription.pk).exists()
    assert not Notification.objects.exists()


def test_resend_sends_one_delivery_again_now_and_returns_to_the_filtered_log(owner_client, world):
    subscription, _ = make_subscription("acme")
    fan_out(make_call("acme", name="c", due_in=HOUR).pk)
    delivered = record_try(subscription.notifications.order_by("event_seq").first(), succeeded=True, status_code=200)
    back = f"{_url(subscription)}?state=SUCCEEDED"

    response = owner_client.post(_url(subscription, f"deliveries/{delivered.pk}/resend"), {"next": back})

    assert response.status_code == 302 and response["Location"] == back
    delivered.refresh_from_db()
    assert delivered.state == Notification.State.PENDING and delivered.manual
    assert delivered.attempts == 1  # the earlier try stays counted


def test_resend_of_another_subscriptions_delivery_is_not_found(owner_client, world):
    subscription, _ = make_subscription("acme")
    other, _ = make_subscription("acme", name="other")
    fan_out(make_call("acme", name="c", due_in=HOUR).pk)
    delivered = record_try(other.notifications.first(), succeeded=True, status_code=200)

    response = owner_client.post(_url(subscription, f"deliveries/{delivered.pk}/resend"))

    assert response.status_code == 404
    assert Notification.objects.get(pk=delivered.pk).state == Notification.State.SUCCEEDED


ACTIONS = [
    ("enabled", {"enabled": "false"}),
    ("rotate-secret", {}),
    ("test", {}),
    ("recover", {"since": "2020-01-01T00:00:00Z"}),
    ("delete", {}),
]


@pytest.mark.parametrize(("action", "data"), ACTIONS, ids=[a for a, _ in ACTIONS])
def test_another_tenants_subscription_cannot_be_acted_on(action, data, outsider_client, world, settings):
    subscription, _ = make_subscription("acme")
    _failed_deliveries(subscription, settings=settings)
    before = (
        Subscription.objects.filter(pk=subscription.pk).values().get(),
        list(Notification.objects.order_by("pk").values()),
    )

    response = outsider_client.post(_url(subscription, action), data)

    assert response.status_code == 404
    after = (
        Subscription.objects.filter(pk=subscription.pk).values().get(),
        list(Notification.objects.order_by("pk").values()),
    )
    assert after == before


def test_another_tenants_delivery_cannot_be_resent(outsider_client, world, settings):
    subscription, _ = make_subscription("acme")
    failed, _ = _failed_deliveries(subscription, settings=settings)
    assert outsider_client.post(_url(subscription, f"deliveries/{failed.pk}/resend")).status_code == 404
    assert Notification.objects.get(pk=failed.pk).state == Notification.State.FAILED


@pytest.mark.parametrize("action", ["enabled", "rotate-secret", "test", "recover"])
def test_actions_are_posts_only(action, owner_client, world):
    subscription, _ = make_subscription("acme")
    assert owner_client.get(_url(subscription, action)).status_code == 405


def test_actions_need_the_csrf_token(world):
    subscription, _ = make_subscription("acme")
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.owner)
    assert client.post(_url(subscription, "delete")).status_code == 403
    assert client.post("/subscriptions/new/", {"name": "x", "url": "https://hooks.example.com/x"}).status_code == 403
    assert Subscription.objects.count() == 1
