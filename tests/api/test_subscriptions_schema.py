"""The subscription operations in GET /api/schema/: documented, and documented as answered."""

from __future__ import annotations

import json

from django.test import Client

from tests.support.factories import make_call
from tests.support.subscriptions import fan_out, record_try, subscriptions_url

OPERATIONS = {
    ("/api/tenants/{tenant_id}/subscriptions", "get"): {"200", "400", "401", "404"},
    ("/api/tenants/{tenant_id}/subscriptions", "post"): {"201", "400", "401", "403", "404", "413"},
    ("/api/tenants/{tenant_id}/subscriptions/{subscription_id}", "get"): {"200", "401", "404"},
    ("/api/tenants/{tenant_id}/subscriptions/{subscription_id}", "patch"): {"200", "400", "401", "403", "404", "413"},
    ("/api/tenants/{tenant_id}/subscriptions/{subscription_id}", "delete"): {"204", "401", "403", "404"},
    ("/api/tenants/{tenant_id}/subscriptions/{subscription_id}/rotate-secret", "post"): {
        "200",
        "400",
        "401",
        "403",
        "404",
    },
    ("/api/tenants/{tenant_id}/subscriptions/{subscription_id}/test", "post"): {"202", "401", "403", "404", "429"},
    ("/api/tenants/{tenant_id}/subscriptions/{subscription_id}/recover", "post"): {
        "200",
        "400",
        "401",
        "403",
        "404",
        "413",
    },
    ("/api/tenants/{tenant_id}/subscriptions/{subscription_id}/deliveries", "get"): {"200", "400", "401", "404"},
    ("/api/tenants/{tenant_id}/deliveries/{notification_id}/resend", "post"): {"202", "401", "403", "404", "429"},
}


def _schema() -> dict:
    return json.loads(Client().get("/api/schema/?format=json").content)


def test_every_operation_is_documented_with_its_answers(db):
    paths = _schema()["paths"]
    for (path, method), statuses in OPERATIONS.items():
        operation = paths[path][method]
        assert set(operation["responses"]) == statuses, (path, method)
        assert operation["summary"] and operation["operationId"]
        for status in statuses - {"200", "201", "202", "204"}:
            assert "application/problem+json" in operation["responses"][status]["content"]
    deliveries = paths["/api/tenants/{tenant_id}/subscriptions/{subscription_id}/deliveries"]["get"]
    assert {p["name"] for p in deliveries["parameters"]} >= {"state", "limit", "cursor"}


def test_request_bodies_refuse_unknown_fields(db):
    schemas = _schema()["components"]["schemas"]
    for name in ("CreateSubscriptionRequest", "PatchedUpdateSubscriptionRequest", "RecoverInputRequest"):
        assert schemas[name]["additionalProperties"] is False
    assert "kind" not in schemas["PatchedUpdateSubscriptionRequest"]["properties"]
    assert schemas["RecoverInputRequest"]["required"] == ["since"]


def test_the_documented_shapes_are_the_ones_the_api_answers(acme_api):
    components = _schema()["components"]["schemas"]
    created = acme_api.post(subscriptions_url(), {"name": "shape", "url": "https://example.com/hook"}).json()
    call = make_call("acme")
    [first, _] = fan_out(call.pk)
    record_try(first, succeeded=False, status_code=500, error="HTTP 500")
    shown = acme_api.get(created["links"]["self"]).json()
    page = acme_api.get(created["links"]["deliveries"]).json()
    delivery = next(d for d in page["results"] if d["deliveryAttempts"])
    detail = acme_api.get(f"/api/tenants/acme/service-calls/{call.pk}").json()

    assert set(components["CreatedSubscription"]["properties"]) == set(created)
    assert set(components["Subscription"]["properties"]) == set(shown)
    assert set(components["SubscriptionFigures"]["properties"]) == set(shown["figures"])
    assert set(components["SubscriptionLinks"]["properties"]) == set(shown["links"])
    assert set(components["DeliveryPage"]["properties"]) == set(page)
    assert set(components["Delivery"]["properties"]) == set(delivery)
    assert set(components["DeliveryAttempt"]["properties"]) == set(delivery["deliveryAttempts"][0])
    assert set(components["EventDelivery"]["properties"]) == set(detail["events"][0]["deliveries"][0])
