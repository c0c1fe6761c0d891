"""Every subscription route keeps tenants apart: another tenant's key or member gets 404 (never
403) whether it names acme's path or its own path with acme's ids, nothing changes, and no
credentials is 401. (tests/security/test_isolation_matrix.py sweeps these routes too.)"""

from __future__ import annotations

import pytest

from delivery.models import DeliveryAttempt, Notification, Subscription
from tests.support.api import ApiClient, assert_problem, session_api
from tests.support.factories import make_call
from tests.support.subscriptions import (
    fan_out,
    make_subscription,
    record_try,
    resend_url,
    subscription_url,
    subscriptions_url,
)


@pytest.fixture
def acme_ids(world):
    subscription, _ = make_subscription("acme", name="acme-hook-secret-name")
    [notification, _] = fan_out(make_call("acme").pk)
    record_try(notification, succeeded=False, status_code=500)
    return str(subscription.pk), str(notification.pk)


def _endpoints(subscription_id: str, notification_id: str, tenant: str):
    one = subscription_url(subscription_id, tenant)
    return [
        ("get", subscriptions_url(tenant), None),
        ("post", subscriptions_url(tenant), {"name": "pwned", "url": "https://evil.example.com/"}),
        ("get", one, None),
        ("patch", one, {"name": "pwned", "enabled": False}),
        ("delete", one, None),
        ("post", f"{one}/rotate-secret", None),
        ("post", f"{one}/test", None),
        ("post", f"{one}/recover", {"since": "2020-01-01T00:00:00Z"}),
        ("get", f"{one}/deliveries", None),
        ("post", resend_url(notification_id, tenant), None),
    ]


def _request(api: ApiClient, method: str, url: str, body):
    if method == "get":
        return api.get(url)
    if method == "delete":
        return api.delete(url)
    return getattr(api, method)(url, body)


def _state():
    return (
        list(Subscription.objects.order_by("pk").values_list("pk", "name", "enabled", "secret", "updated_at")),
        list(Notification.objects.order_by("pk").values_list("pk", "state", "manual", "next_attempt_at")),
        DeliveryAttempt.objects.count(),
    )


@pytest.mark.parametrize("who", ["globex-key", "globex-member"])
@pytest.mark.parametrize("path_tenant", ["acme", "globex"])
def test_outsiders_get_404_on_every_route_and_change_nothing(world, acme_ids, who, path_tenant):
    api = ApiClient(world.globex_key) if who == "globex-key" else session_api(world.outsider)
    before = _state()
    for method, url, body in _endpoints(*acme_ids, path_tenant):
        response = _request(api, method, url, body)
        if path_tenant == "globex" and url == subscriptions_url("globex"):
            continue  # globex's own collection: its own (empty) list, or a subscription of its own
        assert_problem(response, 404)
        assert "acme-hook-secret-name" not in response.content.decode()
    after = _state()
    # globex may have made a subscription of its own on its own path; acme's rows are untouched.
    assert [row for row in after[0] if row[0] in {r[0] for r in before[0]}] == before[0]
    assert after[1:] == before[1:]


def test_without_credentials_every_route_is_401(world, acme_ids):
    api = ApiClient(None)
    for method, url, body in _endpoints(*acme_ids, "acme"):
        assert_problem(_request(api, method, url, body), 401)


def test_acmes_own_key_and_members_reach_every_route(world, acme_ids):
    for api in (ApiClient(world.acme_key), session_api(world.member)):
        for method, url, body in _endpoints(*acme_ids, "acme"):
            if method in ("delete", "patch"):
                continue  # they would change what the next request reads
            assert _request(api, method, url, body).status_code in (200, 201, 202), url
