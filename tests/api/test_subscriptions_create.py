"""POST /api/tenants/{tenantId}/subscriptions: a webhook subscription, its secret shown once."""

from __future__ import annotations

import base64
import json
import uuid

import pytest

from core.secrets import unseal_value
from delivery.models import Subscription
from tests.support.api import assert_problem, session_api
from tests.support.subscriptions import subscription_url, subscriptions_url

HOOK = "https://hooks.example.com/service-agent"


def test_it_creates_a_webhook_and_answers_201_with_its_secret(acme_api):
    response = acme_api.post(
        subscriptions_url(), {"name": "Billing hook", "url": HOOK, "eventTypes": ["ServiceCallFailed"]}
    )

    assert response.status_code == 201, response.content
    body = response.json()
    stored = Subscription.objects.get()
    assert body["subscriptionId"] == str(stored.pk) and uuid.UUID(body["subscriptionId"]).version == 7
    assert response["Location"] == body["links"]["self"]
    assert body["links"]["self"].endswith(f"/api/tenants/acme/subscriptions/{stored.pk}")
    assert {k: body[k] for k in ("tenantId", "kind", "name", "url", "eventTypes", "enabled")} == {
        "tenantId": "acme",
        "kind": "webhook",
        "name": "Billing hook",
        "url": HOOK,
        "eventTypes": ["ServiceCallFailed"],
        "enabled": True,
    }
    assert body["createdAt"].endswith("Z") and len(body["createdAt"]) == len("2030-01-01T09:00:00.000Z")
    assert body["failingSince"] is None and body["lastSuccessAt"] is None and body["disabledReason"] is None
    assert body["figures"]["pending"] == 0 and body["figures"]["lagP50Ms"] is None
    # The secret: whsec_ + base64 of 32 bytes, stored sealed (never in plain text).
    secret = body["secret"]
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert stored.tenant_id == "acme" and stored.event_types == ["ServiceCallFailed"]
    assert secret not in json.dumps(stored.secret)
    assert unseal_value(stored.secret) == secret


def test_kind_defaults_to_webhook_and_enabled_false_is_kept(acme_api):
    body = acme_api.post(subscriptions_url(), {"kind": "webhook", "name": "off", "url": HOOK, "enabled": False}).json()
    assert body["kind"] == "webhook" and body["enabled"] is False
    assert Subscription.objects.get().enabled is False


def test_the_secret_is_shown_only_in_the_creation_answer(acme_api):
    created = acme_api.post(subscriptions_url(), {"name": "once", "url": HOOK}).json()

    shown = [
        acme_api.get(created["links"]["self"]),
        acme_api.get(subscriptions_url()),
        acme_api.patch(created["links"]["self"], {"name": "renamed"}),
    ]

    for response in shown:
        assert response.status_code == 200
        assert created["secret"] not in response.content.decode()
        assert created["secret"][6:] not in response.content.decode()
    assert "secret" not in shown[0].json()


def test_a_member_session_may_create_one(world):
    response = session_api(world.member).post(subscriptions_url(), {"name": "from the browser", "url": HOOK})
    assert response.status_code == 201
    assert Subscription.objects.get().tenant_id == "acme"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"name": "x"}, "url"),
        ({"name": "x", "url": "not a url"}, "url"),
        ({"name": "x", "url": "ftp://example.com/x"}, "url"),
        ({"name": "x", "url": "http://10.0.0.1/hook"}, "url"),
        ({"name": "x", "url": "http://169.254.169.254/latest/meta-data"}, "url"),
        ({"name": "x", "url": "http://user:pw@example.com/"}, "url"),
        ({"name": "x", "url": "https://example.com/" + "a" * 2100}, "url"),
        ({"url": HOOK}, "name"),
        ({"name": "   ", "url": HOOK}, "name"),
        ({"name": "n" * 201, "url": HOOK}, "name"),
        ({"name": "bell\x07", "url": HOOK}, "name"),
        ({"name": 12, "url": HOOK}, "name"),
        ({"name": "x", "url": HOOK, "eventTypes": ["ServiceCallExploded"]}, "eventTypes"),
        ({"name": "x", "url": HOOK, "eventTypes": "ServiceCallFailed"}, "eventTypes"),
        ({"name": "x", "url": HOOK, "eventTypes": [1]}, "eventTypes"),
        ({"name": "x", "url": HOOK, "enabled": "yes"}, "enabled"),
        ({"name": "x", "url": HOOK, "kind": "nats"}, "kind"),
        ({"name": "x", "url": HOOK, "kind": "email"}, "kind"),
        ({"name": "x", "url": HOOK, "subjectTemplate": "serviceagent.{type}"}, "subjectTemplate"),
        ({"name": "x", "url": HOOK, "secret": "whsec_mine"}, "secret"),
        ({"name": "x", "url": HOOK, "tenantId": "globex"}, "tenantId"),
        (["name", "url"], "body"),
    ],
)
def test_bad_input_is_400_with_field_errors_and_stores_nothing(acme_api, payload, field):
    response = acme_api.post(subscriptions_url(), payload)

    assert_problem(response, 400, errors_for=field)
    assert not Subscription.objects.exists()


def test_every_mistake_is_reported_at_once(acme_api):
    body = assert_problem(
        acme_api.post(subscriptions_url(), {"name": "", "url": "http://10.0.0.1/", "eventTypes": ["Nope"]}), 400
    )
    assert set(body["errors"]) == {"name", "url", "eventTypes"}
    assert "egress policy" in body["errors"]["url"][0]


def test_malformed_json_is_400_and_stores_nothing(acme_api):
    response = acme_api.post(subscriptions_url(), raw=b'{"name": "x", ')
    assert_problem(response, 400)
    assert not Subscription.objects.exists()


def test_a_created_subscription_belongs_to_the_path_tenant_only(acme_api, globex_api):
    created = acme_api.post(subscriptions_url(), {"name": "mine", "url": HOOK}).json()
    assert_problem(globex_api.get(subscription_url(created["subscriptionId"], tenant="globex")), 404)


def test_a_body_over_the_size_limit_is_413_and_stores_nothing(acme_api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    response = acme_api.post(subscriptions_url(), {"name": "big", "url": HOOK, "pad": "x" * 4096})
    assert_problem(response, 413)
    assert not Subscription.objects.exists()


def test_a_tenant_has_at_most_max_subscriptions_per_tenant_and_operator_wide_ones_are_exempt(acme_api, settings):
    from delivery.services import subscription_create
    from delivery.validation import validate_subscription

    settings.MAX_SUBSCRIPTIONS_PER_TENANT = 2
    for n in range(2):
        assert acme_api.post(subscriptions_url(), {"name": f"hook {n}", "url": HOOK}).status_code == 201

    refused = acme_api.post(subscriptions_url(), {"name": "one too many", "url": HOOK})

    assert refused.status_code == 400, refused.content
    assert "at most 2 subscriptions" in json.dumps(refused.json())
    assert Subscription.objects.filter(tenant_id="acme").count() == 2
    operator_wide, _ = subscription_create(
        tenant_id=None, data=validate_subscription({"name": "ops", "url": HOOK}, operator=True)
    )
    assert operator_wide.tenant_id is None


def test_the_answer_that_carries_the_secret_is_kept_by_no_cache(acme_api):
    response = acme_api.post(subscriptions_url(), {"name": "Billing hook", "url": HOOK})
    assert response.status_code == 201 and response.json()["secret"].startswith("whsec_")
    assert response["Cache-Control"] == "no-store"
