"""The pages keep the operator's request ceilings as the API does (docs/flow-control.md,
"Operator ceilings"): test pings and submissions made through the dashboard are counted with
the API's, in the shared `limits` cache, so a tenant cannot pass a ceiling by its pages."""

from __future__ import annotations

import pytest
from django.core.cache import caches

from delivery.models import Notification
from orchestration.models import ServiceCall
from tests.support.factories import make_call, make_ceilings
from tests.support.subscriptions import make_subscription


@pytest.fixture(autouse=True)
def empty_limits_cache(db):
    caches["limits"].clear()
    yield
    caches["limits"].clear()


def _messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_test_pings_past_the_ceiling_are_refused_with_the_wait_and_send_nothing(owner_client, world):
    make_ceilings("acme", testPingsPerMinute=2)
    subscription, _ = make_subscription("acme")
    for _ in range(2):
        owner_client.post(f"/subscriptions/{subscription.pk}/test", follow=True)

    response = owner_client.post(f"/subscriptions/{subscription.pk}/test", follow=True)

    assert "No test event was sent. At most 2 test pings a minute" in " ".join(_messages(response))
    assert Notification.objects.filter(subscription=subscription).count() == 2


def test_the_pages_and_the_api_share_one_count_of_test_pings(owner_client, world):
    make_ceilings("acme", testPingsPerMinute=2)
    subscription, _ = make_subscription("acme")
    owner_client.post(f"/subscriptions/{subscription.pk}/test")
    api = owner_client.post(f"/api/tenants/acme/subscriptions/{subscription.pk}/test")
    assert api.status_code == 202, api.content
    again = owner_client.post(f"/api/tenants/acme/subscriptions/{subscription.pk}/test")
    assert again.status_code == 429


def _request_form(key: str) -> dict[str, str]:
    return {
        "name": "Create invoice",
        "method": "GET",
        "url": "https://billing.example.com/invoices",
        "body_format": "json",
        "when": "now",
        "idempotency_key": key,
    }


def test_submissions_past_the_ceiling_are_refused_on_the_request_page_and_store_nothing(
    owner_client, world, still_throttle_clock
):
    make_ceilings("acme", submissionsPerSecond=1)
    first = owner_client.post("/calls/new/", _request_form("page-ceiling-1"))
    assert first.status_code == 200

    second = owner_client.post("/calls/new/", _request_form("page-ceiling-2"))

    assert second.status_code == 400
    assert "Not submitted. At most 1 submissions a second per API key" in second.content.decode()
    assert ServiceCall.objects.filter(tenant_id="acme").count() == 1


def test_run_again_past_the_ceiling_is_refused_and_submits_nothing(owner_client, world, still_throttle_clock):
    make_ceilings("acme", submissionsPerSecond=1)
    call = make_call("acme")
    owner_client.post(f"/calls/{call.pk}/rerun", {"when": "now"})

    response = owner_client.post(f"/calls/{call.pk}/rerun", {"when": "now"}, follow=True)

    assert any(m.startswith("Not submitted again. At most 1") for m in _messages(response)), _messages(response)
    assert ServiceCall.objects.filter(tenant_id="acme").count() == 2
