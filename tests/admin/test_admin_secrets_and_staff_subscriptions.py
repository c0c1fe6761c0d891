"""A secret shown once in the admin (a new API key, a webhook's signing secret) is on the page
that answers the add, and nowhere else: not in an admin message, which would rest in the session
table until the next page (SessionStorage), not in a cookie, not in any cache (Cache-Control:
no-store). And non-superuser staff make webhooks only: no NATS subscription, no subject template
onto another tenant's subjects."""

import re

from django.contrib.auth.models import Permission
from django.contrib.messages.storage.cookie import CookieStorage
from django.contrib.sessions.models import Session

from delivery.models import Subscription
from tests.admin.test_delivery_admin import DELIVERY_PERMISSIONS, SUBSCRIPTIONS

API_KEYS = "/admin/tenants/apikey/"


def shown_secret(response, prefix: str) -> str:
    """The secret on the page that answers an add (core/admin.py, shown_once_response)."""
    assert response.status_code == 200
    [secret] = re.findall(r'class="shown-once-secret">([^<]+)<', response.content.decode())
    assert secret.startswith(prefix)
    return secret


def _assert_not_in_cookies(responses, secret: str) -> None:
    for response in responses:
        assert "messages" not in response.cookies  # the cookie storage is not used
        for morsel in response.cookies.values():
            assert secret not in morsel.OutputString()
            # A signed (not encrypted) cookie may be compressed: decode what would be readable.
            decoded = CookieStorage(response.wsgi_request)._decode(morsel.value)
            assert secret not in repr(decoded)


def _assert_not_in_sessions(secret: str) -> None:
    """Every django_session row, raw and decoded (base64 + zlib, as an attacker reads it)."""
    rows = list(Session.objects.all())
    assert rows  # the admin's own session is there to scan
    for row in rows:
        assert secret not in row.session_data
        assert secret not in repr(row.get_decoded())


def test_a_new_api_key_is_shown_on_the_answer_alone_never_in_the_session_or_a_cookie(admin_client, world):
    created = admin_client.post(API_KEYS + "add/", {"tenant": "acme", "label": "cookie check"})
    raw = shown_secret(created, "sa_")
    assert "no-store" in created["Cache-Control"]
    _assert_not_in_sessions(raw)
    later = admin_client.get(API_KEYS)
    assert raw not in later.content.decode()  # shown once
    _assert_not_in_cookies([created, later], raw)
    _assert_not_in_sessions(raw)


def test_a_webhook_secret_is_shown_on_the_answer_alone_never_in_the_session_or_a_cookie(admin_client, world):
    created = admin_client.post(
        SUBSCRIPTIONS + "add/",
        {"name": "Ops hook", "kind": "webhook", "url": "https://hooks.example.com/ops", "enabled": "on"},
    )
    secret = shown_secret(created, "whsec_")
    assert "no-store" in created["Cache-Control"]
    _assert_not_in_sessions(secret)
    later = admin_client.get(SUBSCRIPTIONS)
    assert secret not in later.content.decode()
    _assert_not_in_cookies([created, later], secret)
    _assert_not_in_sessions(secret)


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
    shown_secret(made, "whsec_")  # made: the page that shows its secret
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
    shown_secret(admin_client.post(SUBSCRIPTIONS + "add/", {**hook, "name": "One"}), "whsec_")

    refused = admin_client.post(SUBSCRIPTIONS + "add/", {**hook, "name": "Two"})

    assert refused.status_code == 200
    assert "at most 1 subscriptions" in str(refused.context["adminform"].form.errors["tenant"])
    assert Subscription.objects.count() == 1
