"""GET and PUT /api/tenants/{tenantId}/flow-control (docs/flow-control.md): the limits as
stored, bad input refused with nothing stored, and another tenant's limits out of reach."""

from __future__ import annotations

import pytest

from orchestration.models import FlowControl, ServiceCall
from tests.support.api import assert_problem, call_url, session_api, submit_via_api
from tests.support.factories import make_flow_control

URL = "/api/tenants/{}/flow-control"
NONE = {"parallelism": None, "ratePerSecond": None, "hosts": {}}
LIMITS = {
    "parallelism": 4,
    "ratePerSecond": 2.5,
    "hosts": {"api.example.com": {"parallelism": 1, "ratePerSecond": None}},
}


def own(body: dict) -> dict:
    """The tenant's own limits of a flow-control body (without the operator's `ceilings` and the
    `effective` limits: tests/api/test_flow_control_ceilings.py)."""
    return {key: body[key] for key in NONE}


def test_a_tenant_without_limits_reads_nulls(acme_api):
    response = acme_api.get(URL.format("acme"))
    assert response.status_code == 200
    assert own(response.json()) == NONE


def test_put_replaces_the_limits_and_answers_them(acme_api):
    response = acme_api.put(URL.format("acme"), LIMITS)
    assert response.status_code == 200, response.content
    assert own(response.json()) == {**LIMITS, "ratePerSecond": 2.5}
    row = FlowControl.objects.get(pk="acme")
    assert (row.parallelism, row.rate_per_second) == (4, 2.5)
    assert acme_api.get(URL.format("acme")).json() == response.json()
    # Absent fields mean no limit; an empty object removes every limit (and the row).
    assert own(acme_api.put(URL.format("acme"), {"ratePerSecond": 1}).json()) == {**NONE, "ratePerSecond": 1.0}
    assert own(acme_api.put(URL.format("acme"), {}).json()) == NONE
    assert not FlowControl.objects.exists()


def test_host_names_are_kept_in_lower_case(acme_api):
    body = acme_api.put(URL.format("acme"), {"hosts": {"API.Example.COM:8443": {"ratePerSecond": 3}}}).json()
    assert body["hosts"] == {"api.example.com:8443": {"parallelism": None, "ratePerSecond": 3.0}}


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"parallelism": 0}, "parallelism"),
        ({"parallelism": -3}, "parallelism"),
        ({"parallelism": "10"}, "parallelism"),
        ({"ratePerSecond": 0}, "ratePerSecond"),
        ({"ratePerSecond": -1.5}, "ratePerSecond"),
        ({"ratePerSecond": "lots"}, "ratePerSecond"),
        ({"ratePerSecond": 100000}, "ratePerSecond"),
        ({"parallelism": 2, "burst": 5}, "burst"),
        ({"hosts": {"not a host": {"parallelism": 1}}}, 'hosts["not a host"]'),
        ({"hosts": {"api.example.com": {"parallelism": 1, "weight": 2}}}, 'hosts["api.example.com"].weight'),
        ({"hosts": {f"h{n}.example.com": {"parallelism": 1} for n in range(51)}}, "hosts"),
        ([1], "body"),
    ],
)
def test_bad_limits_are_refused_and_nothing_is_stored(acme_api, payload, field):
    make_flow_control("acme", parallelism=7)
    response = acme_api.put(URL.format("acme"), payload)
    assert_problem(response, 400, errors_for=field)
    row = FlowControl.objects.get(pk="acme")
    assert (row.parallelism, row.rate_per_second, row.hosts) == (7, None, {})


def test_a_body_that_is_not_json_is_refused(acme_api):
    response = acme_api.client.put(
        URL.format("acme"), "parallelism=3", content_type="application/json", headers=acme_api._headers(None)
    )
    assert_problem(response, 400)
    assert not FlowControl.objects.exists()


@pytest.mark.parametrize("method", ["get", "put"])
def test_another_tenants_flow_control_is_404(globex_api, world, method):
    make_flow_control("acme", parallelism=3)
    response = globex_api.get(URL.format("acme")) if method == "get" else globex_api.put(URL.format("acme"), {})
    body = assert_problem(response, 404)
    assert "3" not in response.content.decode().replace(body["correlationId"], "")
    assert FlowControl.objects.get(pk="acme").parallelism == 3


def test_no_credentials_is_401(anonymous_api):
    assert_problem(anonymous_api.put(URL.format("acme"), {"parallelism": 1}), 401)
    assert not FlowControl.objects.exists()


def test_a_member_session_sets_the_limits(world):
    api = session_api(world.member)
    assert api.put(URL.format("acme"), {"parallelism": 2}).json()["parallelism"] == 2
    assert session_api(world.outsider).get(URL.format("acme")).status_code == 404


def test_the_call_shows_how_long_it_was_held(acme_api):
    body = submit_via_api(acme_api)
    assert body["heldMs"] == 0 and body["heldSince"] is None
    ServiceCall.objects.filter(pk=body["serviceCallId"]).update(held_ms=1234)
    assert acme_api.get(call_url(body["serviceCallId"])).json()["heldMs"] == 1234


def test_the_schema_documents_both_operations(acme_api):
    schema = acme_api.get("/api/schema/", headers={"Accept": "application/json"}).json()
    operations = schema["paths"]["/api/tenants/{tenant_id}/flow-control"]
    assert {operations["get"]["operationId"], operations["put"]["operationId"]} == {
        "flow_control_retrieve",
        "flow_control_update",
    }
