"""The schedule operations in GET /api/schema/: documented, and documented as answered."""

from __future__ import annotations

import json

from django.test import Client
from openapi_spec_validator import validate

from tests.support.schedules import schedule_payload, schedules_url

OPERATIONS = {
    ("/api/tenants/{tenant_id}/schedules", "get"): {"200", "400", "401", "404"},
    ("/api/tenants/{tenant_id}/schedules", "post"): {"201", "400", "401", "403", "404", "413"},
    ("/api/tenants/{tenant_id}/schedules/preview", "get"): {"200", "400", "401", "404"},
    ("/api/tenants/{tenant_id}/schedules/{schedule_id}", "get"): {"200", "401", "404"},
    ("/api/tenants/{tenant_id}/schedules/{schedule_id}", "patch"): {"200", "400", "401", "403", "404", "413"},
    ("/api/tenants/{tenant_id}/schedules/{schedule_id}", "delete"): {"204", "401", "403", "404"},
}


def _schema() -> dict:
    return json.loads(Client().get("/api/schema/?format=json").content)


def test_every_operation_is_documented_with_its_answers(db):
    schema = _schema()
    validate(schema)
    for (path, method), statuses in OPERATIONS.items():
        operation = schema["paths"][path][method]
        assert set(operation["responses"]) == statuses, (path, method)
        assert operation["summary"] and operation["operationId"]
        for status in statuses - {"200", "201", "204"}:
            assert "application/problem+json" in operation["responses"][status]["content"]
    preview = schema["paths"]["/api/tenants/{tenant_id}/schedules/preview"]["get"]
    assert {p["name"] for p in preview["parameters"]} >= {"cron", "timezone"}


def test_request_bodies_refuse_unknown_fields(db):
    schemas = _schema()["components"]["schemas"]
    for name in ("CreateScheduleRequest", "PatchedUpdateScheduleRequest"):
        assert schemas[name]["additionalProperties"] is False
    # A cron or an interval (`every`): neither alone is required.
    assert set(schemas["CreateScheduleRequest"]["required"]) == {"name", "requestSpec"}


def test_the_documented_shapes_are_the_ones_the_api_answers(acme_api):
    components = _schema()["components"]["schemas"]
    created = acme_api.post(schedules_url(), schedule_payload()).json()
    page = acme_api.get(schedules_url()).json()
    preview = acme_api.get(schedules_url(suffix="/preview"), {"cron": "0 9 * * *"}).json()

    assert set(components["ScheduleDetail"]["properties"]) == set(created)
    assert set(components["Schedule"]["properties"]) == set(page["results"][0])
    # `dueAt` only with a jitter.
    assert set(components["ScheduleRun"]["properties"]) == set(created["nextRuns"][0]) | {"dueAt"}
    assert set(components["ScheduleLinks"]["properties"]) == set(created["links"])
    assert set(components["SchedulePage"]["properties"]) == set(page)
    assert set(components["Preview"]["properties"]) == set(preview)
    assert set(components["ServiceCall"]["properties"]) == set(created["recentCalls"][0])
