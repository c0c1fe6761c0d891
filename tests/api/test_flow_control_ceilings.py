"""The operator's ceilings seen through PUT/GET /api/tenants/{tenantId}/flow-control
(docs/flow-control.md, "Operator ceilings"): a tenant's own limits stay at or below them, `{}`
removes only its own, a request without a body changes nothing, and no tenant sees another's."""

from __future__ import annotations

import pytest

from orchestration.admission import flow_limits_effective
from orchestration.models import FlowControl
from tests.support.api import assert_problem
from tests.support.factories import make_ceilings, make_flow_control

URL = "/api/tenants/{}/flow-control"


def stored(tenant: str = "acme") -> tuple:
    row = FlowControl.objects.filter(pk=tenant).first()
    return (row.parallelism, row.rate_per_second, row.hosts) if row else None


def test_get_shows_the_ceilings_and_the_limits_in_force(acme_api):
    make_ceilings("acme", parallelism=5, ratePerSecond=2, subscriptions=7)
    make_flow_control("acme", parallelism=3)

    body = acme_api.get(URL.format("acme")).json()

    assert (body["parallelism"], body["ratePerSecond"]) == (3, None)
    assert body["ceilings"]["parallelism"] == 5
    assert body["ceilings"]["ratePerSecond"] == 2.0
    assert body["ceilings"]["subscriptions"] == 7
    assert body["effective"] == {"parallelism": 3, "ratePerSecond": 2.0}


def test_a_limit_above_the_ceiling_is_refused_naming_the_field_and_the_ceiling(acme_api):
    make_ceilings("acme", parallelism=5, ratePerSecond=2)
    make_flow_control("acme", parallelism=4)

    response = acme_api.put(URL.format("acme"), {"parallelism": 6, "ratePerSecond": 3})

    body = assert_problem(response, 400, errors_for="parallelism")
    assert "At most 5" in body["errors"]["parallelism"][0]
    assert "At most 2" in body["errors"]["ratePerSecond"][0]
    assert stored() == (4, None, {})


def test_a_host_limit_above_the_ceiling_is_refused_too(acme_api):
    make_ceilings("acme", parallelism=5)
    response = acme_api.put(URL.format("acme"), {"hosts": {"api.example.com": {"parallelism": 9}}})
    assert_problem(response, 400, errors_for='hosts["api.example.com"].parallelism')
    assert stored() is None


def test_put_at_the_ceiling_is_accepted(acme_api):
    make_ceilings("acme", parallelism=5)
    assert acme_api.put(URL.format("acme"), {"parallelism": 5}).status_code == 200
    assert stored()[0] == 5


def test_put_empty_object_removes_the_tenants_limits_but_not_the_operators(acme_api):
    make_ceilings("acme", parallelism=5, ratePerSecond=2)
    make_flow_control("acme", parallelism=3, rate=1)

    body = acme_api.put(URL.format("acme"), {}).json()

    assert (body["parallelism"], body["ratePerSecond"], body["hosts"]) == (None, None, {})
    assert body["effective"] == {"parallelism": 5, "ratePerSecond": 2.0}
    limits = flow_limits_effective(tenant_id="acme").tenant
    assert (limits.parallelism, limits.rate) == (5, 2.0)


def test_put_without_a_body_is_400_and_changes_nothing(acme_api):
    make_flow_control("acme", parallelism=3, rate=1)

    response = acme_api.put(URL.format("acme"))

    assert_problem(response, 400, errors_for="body")
    assert stored() == (3, 1.0, {})


def test_the_read_only_fields_of_a_get_are_ignored_in_a_put(acme_api):
    make_ceilings("acme", parallelism=5)
    body = acme_api.get(URL.format("acme")).json()
    body["parallelism"] = 2
    body["ceilings"]["parallelism"] = 1000  # not the tenant's to set

    assert acme_api.put(URL.format("acme"), body).status_code == 200
    assert stored()[0] == 2
    assert acme_api.get(URL.format("acme")).json()["ceilings"]["parallelism"] == 5


def test_a_tenant_sees_only_its_own_ceilings(acme_api, globex_api, settings):
    make_ceilings("acme", parallelism=5, submissionsPerSecond=3)

    globex = globex_api.get(URL.format("globex")).json()["ceilings"]
    assert globex["parallelism"] is None
    assert globex["submissionsPerSecond"] == settings.CEILING_SUBMISSIONS_PER_SECOND
    assert_problem(globex_api.get(URL.format("acme")), 404)
    assert_problem(globex_api.put(URL.format("acme"), {}), 404)


@pytest.mark.parametrize("defaults", [{"CEILING_CALL_PARALLELISM": 4}, {"CEILING_CALL_RATE_PER_SECOND": 0.5}])
def test_a_default_ceiling_applies_to_every_tenant(acme_api, settings, defaults):
    for name, value in defaults.items():
        setattr(settings, name, value)
    response = acme_api.put(URL.format("acme"), {"parallelism": 10, "ratePerSecond": 10})
    assert_problem(response, 400)
    assert stored() is None


def test_a_limit_stored_before_the_ceiling_was_lowered_can_be_sent_back_unchanged(acme_api):
    make_flow_control("acme", parallelism=10)
    make_ceilings("acme", parallelism=5)

    # The settings page sends every field back, this one unchanged, with a host limit added.
    kept = acme_api.put(URL.format("acme"), {"parallelism": 10, "hosts": {"api.example.com": {"parallelism": 2}}})

    assert kept.status_code == 200, kept.content
    assert kept.json()["effective"]["parallelism"] == 5  # the ceiling wins all the same
    raised = acme_api.put(URL.format("acme"), {"parallelism": 11})
    assert_problem(raised, 400, errors_for="parallelism")
    assert stored()[0] == 10
