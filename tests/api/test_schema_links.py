"""The OpenAPI document a reader (and a client generator or a stateful fuzzer) meets: operations
tagged by resource in the order of docs/api.md, a description naming schedules and
subscriptions, and links from a created resource to what may follow, each naming an operation
and parameters that exist, and followed here for real."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.support.api import ApiClient, calls_url, valid_payload
from tests.support.schedules import schedule_payload

ORDER = ["Service calls", "Schedules", "Subscriptions", "Events", "Flow control", "Connections", "Signing"]


@pytest.fixture(scope="module")
def schema(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        return Client().get("/api/schema/?format=json").json()


def operations(schema):
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            if isinstance(operation, dict) and "operationId" in operation:
                yield path, method, operation


def test_operations_are_tagged_by_resource_in_the_readers_order(schema):
    assert [tag["name"] for tag in schema["tags"]] == ORDER
    met = []
    for _, _, operation in operations(schema):
        (tag,) = operation["tags"]
        if not met or met[-1] != tag:
            met.append(tag)
    assert met == ORDER  # each resource's operations together, in that order
    assert "schedule" in schema["info"]["description"] and "subscriptions" in schema["info"]["description"]


def test_every_link_names_an_operation_and_its_parameters(schema):
    by_id = {operation["operationId"]: (path, operation) for path, _, operation in operations(schema)}
    links = 0
    for _, _, operation in operations(schema):
        for response in operation["responses"].values():
            for name, link in response.get("links", {}).items():
                links += 1
                path, target = by_id[link["operationId"]]
                accepted = {parameter["name"] for parameter in target.get("parameters", [])}
                assert set(link["parameters"]) <= accepted, (name, link, accepted)
    assert links >= 12


def _follow(schema, api, response, operation_id: str, status: str, name: str, request_path: dict):
    """Evaluate a link's expressions against a real response and call its target."""
    by_id = {operation["operationId"]: (path, method) for path, method, operation in operations(schema)}
    source = next(op for _, _, op in operations(schema) if op["operationId"] == operation_id)
    link = source["responses"][status]["links"][name]
    path, method = by_id[link["operationId"]]
    body = response.json()
    values = {}
    for parameter, expression in link["parameters"].items():
        if expression.startswith("$request.path."):
            values[parameter] = request_path[expression.removeprefix("$request.path.")]
        else:
            values[parameter] = body[expression.removeprefix("$response.body#/")]
    url = path
    query = {}
    for parameter, value in values.items():
        if "{" + parameter + "}" in url:
            url = url.replace("{" + parameter + "}", str(value))
        else:
            query[parameter] = value
    if method == "get":
        return api.get(url, query)
    return api.post(url, {}) if method == "post" else api.put(url, {"tags": ["linked"]})


def test_the_links_lead_where_they_say(schema, world):
    api = ApiClient(world.acme_key)
    tenant = {"tenant_id": "acme"}
    submitted = api.post(calls_url("acme"), valid_payload())
    assert submitted.status_code == 202
    got = _follow(schema, api, submitted, "service_calls_submit", "202", "GetCall", tenant)
    assert got.status_code == 200 and got.json()["serviceCallId"] == submitted.json()["serviceCallId"]
    tagged = _follow(schema, api, submitted, "service_calls_submit", "202", "SetCallTags", tenant)
    assert tagged.status_code == 200 and tagged.json()["tags"] == ["linked"]

    made = api.post("/api/tenants/acme/schedules", schedule_payload())
    assert made.status_code == 201
    calls = _follow(schema, api, made, "schedules_create", "201", "ListItsCalls", tenant)
    assert calls.status_code == 200
    assert [call["scheduleId"] for call in calls.json()["results"]] == [made.json()["scheduleId"]]
