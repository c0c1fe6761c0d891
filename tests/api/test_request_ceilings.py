"""The request ceilings (docs/flow-control.md, "Operator ceilings"): submissions a second per
API key and test pings a minute per tenant answer 429 problem+json with Retry-After past them,
counted in the shared `limits` cache; subscriptions and retry policies past theirs are a 400
naming the field; nothing is stored."""

from __future__ import annotations

import pytest
from django.core.cache import caches

from delivery.models import Subscription
from orchestration.models import ServiceCall
from tests.support.api import ApiClient, assert_problem, call_url, calls_url, valid_payload
from tests.support.factories import make_api_key, make_call, make_ceilings
from tests.support.subscriptions import fan_out, make_subscription, subscription_url, subscriptions_url


@pytest.fixture(autouse=True)
def empty_limits_cache(db):
    # The database cache's table is not a model's: a test's rollback or flush leaves its rows.
    caches["limits"].clear()
    yield
    caches["limits"].clear()


def test_submissions_past_the_ceiling_get_429_with_retry_after(acme_api, still_throttle_clock):
    make_ceilings("acme", submissionsPerSecond=2)
    for _ in range(2):
        assert acme_api.post(calls_url("acme"), valid_payload()).status_code == 202

    refused = acme_api.post(calls_url("acme"), valid_payload())

    body = assert_problem(refused, 429)
    assert 1 <= int(refused["Retry-After"]) <= 1
    assert "2 submissions a second per API key" in body["detail"]
    assert ServiceCall.objects.count() == 2


def test_the_submission_ceiling_counts_per_api_key_and_tenant(acme_api, globex_api, still_throttle_clock):
    make_ceilings("acme", submissionsPerSecond=1)
    make_ceilings("globex", submissionsPerSecond=1)
    assert acme_api.post(calls_url("acme"), valid_payload()).status_code == 202
    assert_problem(acme_api.post(calls_url("acme"), valid_payload()), 429)

    _, second_key = make_api_key("acme")
    assert ApiClient(second_key).post(calls_url("acme"), valid_payload()).status_code == 202
    assert globex_api.post(calls_url("globex"), valid_payload()).status_code == 202
    # Reads are not submissions.
    assert acme_api.get(calls_url("acme")).status_code == 200


def test_a_rerun_counts_as_a_submission(acme_api, still_throttle_clock):
    make_ceilings("acme", submissionsPerSecond=1)
    call = acme_api.post(calls_url("acme"), valid_payload()).json()

    refused = acme_api.post(call_url(call["serviceCallId"], suffix="/rerun"))

    assert_problem(refused, 429)
    assert refused["Retry-After"]
    assert ServiceCall.objects.count() == 1


def test_a_stranger_gets_404_not_a_count_of_another_tenants_ceiling(acme_api, globex_api):
    make_ceilings("acme", submissionsPerSecond=1)
    for _ in range(3):
        assert_problem(globex_api.post(calls_url("acme"), valid_payload()), 404)
    assert acme_api.post(calls_url("acme"), valid_payload()).status_code == 202


def test_test_pings_past_the_ceiling_get_429_with_retry_after(acme_api):
    make_ceilings("acme", testPingsPerMinute=2)
    subscription, _ = make_subscription("acme")
    url = subscription_url(subscription.pk, suffix="/test")
    for _ in range(2):
        assert acme_api.post(url).status_code == 202

    refused = acme_api.post(url)

    body = assert_problem(refused, 429)
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert "2 test pings a minute" in body["detail"]


def test_the_default_ceilings_protect_a_fresh_install(acme_api, settings):
    settings.CEILING_SUBMISSIONS_PER_SECOND = 50
    settings.CEILING_TEST_PINGS_PER_MINUTE = 10
    subscription, _ = make_subscription("acme")
    url = subscription_url(subscription.pk, suffix="/test")
    answers = [acme_api.post(url).status_code for _ in range(11)]
    assert answers == [202] * 10 + [429]


def test_a_subscription_past_the_ceiling_is_refused(acme_api):
    make_ceilings("acme", subscriptions=1)
    assert acme_api.post(subscriptions_url(), {"name": "one", "url": "https://hooks.example.com/1"}).status_code == 201

    refused = acme_api.post(subscriptions_url(), {"name": "two", "url": "https://hooks.example.com/2"})

    body = assert_problem(refused, 400, errors_for="body")
    assert "at most 1 subscriptions" in body["errors"]["body"][0]
    assert Subscription.objects.filter(tenant_id="acme").count() == 1


@pytest.mark.parametrize(
    ("policy", "field", "words"),
    [
        ({"maxAttempts": 4}, "retryPolicy.maxAttempts", "At most 3"),
        ({"maxAttempts": 2, "minBackoffMs": 500}, "retryPolicy.minBackoffMs", "At least 2000"),
    ],
)
def test_a_retry_policy_past_the_ceilings_is_refused(acme_api, policy, field, words):
    make_ceilings("acme", maxAttempts=3, minBackoffMs=2000)

    refused = acme_api.post(calls_url("acme"), valid_payload(retryPolicy=policy))

    body = assert_problem(refused, 400, errors_for=field)
    assert words in body["errors"][field][0]
    assert not ServiceCall.objects.exists()


def test_a_retry_policy_within_the_ceilings_is_accepted(acme_api):
    make_ceilings("acme", maxAttempts=3, minBackoffMs=2000)
    policy = {"maxAttempts": 3, "minBackoffMs": 2000}
    assert acme_api.post(calls_url("acme"), valid_payload(retryPolicy=policy)).status_code == 202
    # One attempt never waits: its backoff is not held to the floor.
    assert acme_api.post(calls_url("acme"), valid_payload(retryPolicy={"maxAttempts": 1})).status_code == 202


def test_a_retry_policy_that_names_no_backoff_gets_the_operators_floor(acme_api):
    """The default backoff (1000 ms) under the floor is raised to it, not refused: the tenant
    asked for no backoff in particular."""
    make_ceilings("acme", maxAttempts=3, minBackoffMs=5000)

    accepted = acme_api.post(calls_url("acme"), valid_payload(retryPolicy={"maxAttempts": 3}))

    assert accepted.status_code == 202, accepted.content
    stored = ServiceCall.objects.get().retry_policy
    assert stored["minBackoffMs"] == 5000 and stored["maxBackoffMs"] >= 5000
    # Named, the same backoff is refused, with the field.
    refused = acme_api.post(calls_url("acme"), valid_payload(retryPolicy={"maxAttempts": 3, "minBackoffMs": 1000}))
    assert_problem(refused, 400, errors_for="retryPolicy.minBackoffMs")


def test_resends_count_with_the_test_pings(acme_api, still_throttle_clock):
    make_ceilings("acme", testPingsPerMinute=2)
    subscription, _ = make_subscription("acme")
    notification = fan_out(make_call("acme").pk)[0]
    assert acme_api.post(f"/api/tenants/acme/subscriptions/{subscription.pk}/test").status_code == 202
    assert acme_api.post(f"/api/tenants/acme/deliveries/{notification.pk}/resend").status_code == 202

    refused = acme_api.post(f"/api/tenants/acme/deliveries/{notification.pk}/resend")

    body = assert_problem(refused, 429)
    assert body["detail"].startswith("At most 2 test pings a minute for this tenant")
    assert body["detail"].count("seconds") == 1  # the wait said once
