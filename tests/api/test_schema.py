"""GET /api/schema/: a valid OpenAPI 3 document that matches what the API answers."""

from __future__ import annotations

import json

from django.test import Client
from openapi_spec_validator import validate

from tests.support.api import submit_via_api


def _schema() -> dict:
    response = Client().get("/api/schema/", headers={"Accept": "application/vnd.oai.openapi+json"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    return json.loads(response.content)


def test_it_serves_a_valid_openapi_3_document(db):
    schema = _schema()

    validate(schema)
    assert schema["openapi"].startswith("3.")
    assert set(schema["paths"]) == {
        "/api/tenants/{tenant_id}/service-calls",
        "/api/tenants/{tenant_id}/service-calls/batch",
        "/api/tenants/{tenant_id}/service-calls/bulk",
        "/api/tenants/{tenant_id}/service-calls/{service_call_id}",
        "/api/tenants/{tenant_id}/service-calls/{service_call_id}/tags",
        "/api/tenants/{tenant_id}/service-calls/{service_call_id}/rerun",
        "/api/tenants/{tenant_id}/service-calls/{service_call_id}/cancel",
        "/api/tenants/{tenant_id}/events",
        "/api/tenants/{tenant_id}/flow-control",
        "/api/tenants/{tenant_id}/signing",
        "/api/tenants/{tenant_id}/connections",
        "/api/tenants/{tenant_id}/connections/{name}",
        "/api/tenants/{tenant_id}/subscriptions",
        "/api/tenants/{tenant_id}/subscriptions/{subscription_id}",
        "/api/tenants/{tenant_id}/subscriptions/{subscription_id}/rotate-secret",
        "/api/tenants/{tenant_id}/subscriptions/{subscription_id}/test",
        "/api/tenants/{tenant_id}/subscriptions/{subscription_id}/recover",
        "/api/tenants/{tenant_id}/subscriptions/{subscription_id}/deliveries",
        "/api/tenants/{tenant_id}/deliveries/{notification_id}/resend",
        "/api/tenants/{tenant_id}/schedules",
        "/api/tenants/{tenant_id}/schedules/preview",
        "/api/tenants/{tenant_id}/schedules/{schedule_id}",
        "/api/tenants/{tenant_id}/schedules/{schedule_id}/backfill",
    }
    assert schema["components"]["securitySchemes"]["apiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["apiKey"]["description"],
    }


def test_format_json_works_too(db):
    response = Client().get("/api/schema/?format=json")
    assert response.status_code == 200
    assert json.loads(response.content)["info"]["title"] == "Service Agent API"


def test_operations_document_their_problem_responses(db):
    paths = _schema()["paths"]
    submit_op = paths["/api/tenants/{tenant_id}/service-calls"]["post"]

    assert set(submit_op["responses"]) == {"200", "202", "400", "401", "403", "404", "409", "413", "429"}
    assert "application/problem+json" in submit_op["responses"]["400"]["content"]
    list_op = paths["/api/tenants/{tenant_id}/service-calls"]["get"]
    names = {p["name"] for p in list_op["parameters"]}
    assert names >= {
        "status",
        "tag",
        "q",
        "submittedFrom",
        "submittedTo",
        "dueFrom",
        "dueTo",
        "favorite",
        "limit",
        "cursor",
    }


def test_the_documented_call_shape_is_the_one_the_api_answers(acme_api):
    components = _schema()["components"]["schemas"]
    answered = submit_via_api(acme_api)
    detail = acme_api.get(answered["links"]["self"]).json()

    assert set(components["ServiceCall"]["properties"]) == set(answered)
    assert set(components["ServiceCallDetail"]["properties"]) == set(detail)
    assert set(components["CallEvent"]["properties"]) == set(detail["events"][0])
    assert set(components["Event"]["properties"]) == set(detail["events"][0]) - {"deliveries"}
    assert set(components["Links"]["properties"]) >= set(answered["links"])


def test_request_bodies_that_refuse_unknown_fields_say_so(acme_api):
    schemas = _schema()["components"]["schemas"]
    for name in ("SubmitServiceCallRequest", "RequestSpecRequest", "TagsInputRequest", "RerunInputRequest"):
        assert schemas[name]["additionalProperties"] is False
    # ...and the API does refuse them.
    call = submit_via_api(acme_api)
    response = acme_api.put(call["links"]["tags"], {"tags": [], "extra": True})
    assert response.status_code == 400 and "body" in response.json()["errors"]


def test_the_rerun_documents_its_optional_due_time(db):
    schema = _schema()
    rerun = schema["paths"]["/api/tenants/{tenant_id}/service-calls/{service_call_id}/rerun"]["post"]

    body = rerun["requestBody"]
    assert not body.get("required")  # an empty body runs it again now
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RerunInputRequest"}
    rerun_input = schema["components"]["schemas"]["RerunInputRequest"]
    assert set(rerun_input["properties"]) == {"dueAt"} and not rerun_input.get("required")
    assert rerun_input["properties"]["dueAt"]["format"] == "date-time"
    assert "dueAt" in rerun["description"]
    assert {"202", "400", "404"} <= set(rerun["responses"])
