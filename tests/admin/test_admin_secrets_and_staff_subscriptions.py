"""A secret shown once in the admin (a new API key, a webhook's signing secret) travels in the
server-side session, never in a cookie (MESSAGE_STORAGE); and non-superuser staff make
webhooks only: no NATS subscription, no subject template onto another tenant's subjects."""

from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.contrib.messages.storage.cookie import CookieStorage

from delivery.models import Subscription
from tests.admin.test_delivery_admin import DELIVERY_PERMISSIONS, SUBSCRIPTIONS

API_KEYS = "/admin/tenants/apikey/"


def _secret(response, marker: str, prefix: str) -> str:
    [text] = [str(m) for m in get_messages(response.wsgi_request) if marker in str(m)]
    return next(word for word in text.split() if word.startswith(prefix))


def _assert_not_in_cookies(responses, secret: str) -> None:
    for response in responses:
        assert "messages" not in response.cookies  # the cookie storage is not used
        for morsel in response.cookies.values():
            assert secret not in morsel.OutputString()
            # A signed (not encrypted) cookie may be compressed: decode what would be readable.
            decoded = CookieStorage(response.wsgi_request)._decode(morsel.value)
            assert secret not in repr(decoded)


def test_a_new_api_key_is_never_set_in_a_cookie(admin_client, world):
    created = admin_client.post(API_KEYS + "add/", {"tenant": "acme", "label": "cookie check"})
    raw = _secret(created, "New API key", "sa_")
    shown = admin_client.get(created["Location"])

    assert raw in shown.content.decode()  # still shown once
    _assert_not_in_cookies([created, shown], raw)


def test_a_webhook_secret_is_never_set_in_a_cookie(admin_client, world):
    created = admin_client.post(
        SUBSCRIPTIONS + "add/",
        {"name": "Ops hook", "kind": "webhook", "url": "https://hooks.example.com/ops", "enabled": "on"},
    )
    secret = _secret(created, "Signing secret", "whsec_")
    shown = admin_client.get(created["Location"])

    assert secret in shown.content.decode()
    _assert_not_in_cookies([created, shown], secret)


def test_scoped_staff_cannot_make_a_nats_subscription_onto_another_tenants_subject(client, world):
    world.staff_globex.user_permissions.set(Permission.objects.filter(codename__in=DELIVERY_PERMISSIONS))
    client.force_login(world.staff_globex)

    refused = client.post(
        SUBSCRIPTIONS + "add/",
        {
            "tenant": "globex",
            "kind": "nats",
            "name": "Sneaky",
            "subject_template": "serviceagent.acme.{type}",
            "enabled": "on",
        },
    )

    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors["kind"]
    assert not Subscription.objects.exists()
    made = client.post(
        SUBSCRIPTIONS + "add/",
        {"tenant": "globex", "kind": "webhook", "name": "Hook", "url": "https://hooks.example.com/g", "enabled": "on"},
    )
    assert made.status_code == 302
    assert Subscription.objects.get().subject_template == ""


def test_scoped_staff_cannot_give_a_webhook_a_subject_template(client, world):
    world.staff_globex.user_permissions.set(Permission.objects.filter(codename__in=DELIVERY_PERMISSIONS))
    client.force_login(world.staff_globex)

    refused = client.post(
        SUBSCRIPTIONS + "add/",
        {
            "tenant": "globex",
            "kind": "webhook",
            "name": "Hook",
            "url": "https://hooks.example.com/g",
            "subject_template": "serviceagent.acme.{type}",
            "enabled": "on",
        },
    )

    assert refused.status_code == 200
    assert not Subscription.objects.exists()


def test_the_admin_refuses_a_subscription_past_the_tenants_limit(admin_client, world, settings):
    settings.MAX_SUBSCRIPTIONS_PER_TENANT = 1
    hook = {"tenant": "acme", "kind": "webhook", "url": "https://hooks.example.com/a", "enabled": "on"}
    assert admin_client.post(SUBSCRIPTIONS + "add/", {**hook, "name": "One"}).status_code == 302

    refused = admin_client.post(SUBSCRIPTIONS + "add/", {**hook, "name": "Two"})

    assert refused.status_code == 200
    assert "at most 1 subscriptions" in str(refused.context["adminform"].form.errors["tenant"])
    assert Subscription.objects.count() == 1
