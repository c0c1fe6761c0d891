"""A submission's retryPolicy and the agent's own attempt headers, through the API: a bad
value is a 400 naming the field, and nothing is stored (docs/retries.md, 'Retry policy')."""

from __future__ import annotations

import pytest

from execution.models import HttpExecution
from orchestration.models import ServiceCall, ServiceCallTag
from tests.support.api import assert_problem, calls_url, stored_counts, valid_payload


def _everything_stored() -> tuple:
    return (*stored_counts(), ServiceCallTag.objects.count(), HttpExecution.objects.count())


BAD_POLICIES = [
    ({"maxAttempts": 0}, "retryPolicy.maxAttempts"),
    ({"maxAttempts": 21}, "retryPolicy.maxAttempts"),
    ({"maxAttempts": -1}, "retryPolicy.maxAttempts"),
    ({"maxAttempts": "3"}, "retryPolicy.maxAttempts"),
    ({"maxAttempts": 2.5}, "retryPolicy.maxAttempts"),
    ({"maxAttempts": True}, "retryPolicy.maxAttempts"),
    ({"maxAttempts": 3, "minBackoffMs": 99}, "retryPolicy.minBackoffMs"),
    ({"maxAttempts": 3, "maxBackoffMs": 86_400_001}, "retryPolicy.maxBackoffMs"),
    ({"maxAttempts": 3, "minBackoffMs": 5000, "maxBackoffMs": 1000}, "retryPolicy.minBackoffMs"),
    ({"maxAttempts": 3, "minBackoffMs": 120_000}, None),  # above the default max: accepted
    ({"maxAttempts": 3, "retryOn": ["HttpError4xx"]}, "retryPolicy.retryOn"),
    ({"maxAttempts": 3, "retryOn": ["Timeout", "timeout"]}, "retryPolicy.retryOn"),
    ({"maxAttempts": 3, "retryOn": ["Interrupted"]}, "retryPolicy.retryOn"),
    ({"maxAttempts": 3, "retryOn": "Timeout"}, "retryPolicy.retryOn"),
    ({"maxAttempts": 3, "retryOn": [1]}, "retryPolicy.retryOn"),
    ({"maxAttempts": 3, "retryOn": {"Timeout": True}}, "retryPolicy.retryOn"),
    ({"maxAttempts": 3, "backoff": 100}, "retryPolicy"),
    ({"maxAttempts": 3, "maxRetries": 2}, "retryPolicy"),
    ({"maxAttempts": 3, "retryInterrupted": "true"}, "retryPolicy.retryInterrupted"),
    ({"maxAttempts": 3, "retryInterrupted": 1}, "retryPolicy.retryInterrupted"),
    ({"maxAttempts": 3, "retryInterrupted": None}, "retryPolicy.retryInterrupted"),
]


@pytest.mark.parametrize(("policy", "field"), BAD_POLICIES, ids=[str(p) for p, _ in BAD_POLICIES])
def test_it_refuses_a_bad_retry_policy_naming_the_field_and_stores_nothing(acme_api, policy, field):
    before = _everything_stored()

    response = acme_api.post(calls_url(), valid_payload(retryPolicy=policy))

    if field is None:
        assert response.status_code == 202, response.content
        assert response.json()["retryPolicy"]["maxBackoffMs"] == policy["minBackoffMs"]
        return
    assert_problem(response, 400, errors_for=field)
    assert _everything_stored() == before


@pytest.mark.parametrize("policy", [[], ["maxAttempts", 3], "3", 3, True, [{"maxAttempts": 3}]])
def test_it_refuses_a_retry_policy_that_is_not_an_object(acme_api, policy):
    before = _everything_stored()

    response = acme_api.post(calls_url(), valid_payload(retryPolicy=policy))

    body = assert_problem(response, 400, errors_for="retryPolicy")
    assert "object" in " ".join(body["errors"]["retryPolicy"])
    assert _everything_stored() == before


def test_every_error_of_a_policy_is_named_at_once(acme_api):
    before = _everything_stored()
    policy = {"maxAttempts": 0, "minBackoffMs": 50, "retryOn": ["Sometimes"], "retryInterrupted": "no", "x": 1}

    body = assert_problem(acme_api.post(calls_url(), valid_payload(retryPolicy=policy)), 400)

    assert {
        "retryPolicy",
        "retryPolicy.maxAttempts",
        "retryPolicy.minBackoffMs",
        "retryPolicy.retryOn",
        "retryPolicy.retryInterrupted",
    } <= set(body["errors"])
    assert _everything_stored() == before


@pytest.mark.parametrize(
    "name", ["X-Service-Call-Id", "X-Service-Call-Attempt", "x-service-call-id", "X-SERVICE-CALL-ATTEMPT"]
)
def test_it_refuses_a_user_given_attempt_header_the_agent_sets_itself(acme_api, name):
    before = _everything_stored()
    headers = {"Content-Type": "application/json", name: "1"}

    response = acme_api.post(calls_url(), valid_payload(spec={"headers": headers}))

    body = assert_problem(response, 400, errors_for="requestSpec.headers")
    assert any("set by the agent" in message for message in body["errors"]["requestSpec.headers"])
    assert _everything_stored() == before


def test_a_good_policy_is_stored_with_its_defaults_and_shown_back(acme_api):
    response = acme_api.post(calls_url(), valid_payload(retryPolicy={"maxAttempts": 4, "retryOn": ["Timeout"]}))

    assert response.status_code == 202, response.content
    shown = response.json()
    expected = {
        "maxAttempts": 4,
        "minBackoffMs": 1000,
        "maxBackoffMs": 60000,
        "retryOn": ["Timeout"],
        "retryInterrupted": False,
    }
    assert shown["retryPolicy"] == expected
    assert (shown["attempt"], shown["nextAttemptAt"], shown["lastError"], shown["outcome"]) == (0, None, None, None)
    assert shown["links"]["cancel"] == shown["links"]["self"] + "/cancel"
    assert ServiceCall.objects.get(pk=shown["serviceCallId"]).retry_policy == expected


def test_no_policy_means_one_attempt_and_null_in_the_representation(acme_api):
    response = acme_api.post(calls_url(), valid_payload())

    assert response.status_code == 202, response.content
    assert response.json()["retryPolicy"] is None
    assert ServiceCall.objects.get(pk=response.json()["serviceCallId"]).retry_policy is None


def test_a_rerun_keeps_the_original_policy(acme_api):
    """docs/retries.md, 'Retry policy': a rerun keeps the original's policy."""
    policy = {"maxAttempts": 4, "minBackoffMs": 500, "maxBackoffMs": 8000, "retryOn": ["Timeout"]}
    original = acme_api.post(calls_url(), valid_payload(retryPolicy=policy)).json()

    response = acme_api.post(original["links"]["rerun"])

    assert response.status_code == 202, response.content
    rerun = response.json()
    assert rerun["retryPolicy"] == original["retryPolicy"]
    assert ServiceCall.objects.get(pk=rerun["serviceCallId"]).retry_policy == original["retryPolicy"]
