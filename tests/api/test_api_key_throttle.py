"""Failed API-key authentications: past API_KEY_FAILURE_LIMIT from one address within the
window, that address's bad keys get 429 problem+json with Retry-After; a valid key still passes.
docs/security.md#6-deployment-hardening"""

import pytest
from django.core.cache import caches
from django.test import Client

from tenants.authentication import THROTTLE_CACHE
from tests.support.api import calls_url

LIMIT = 3


@pytest.fixture
def limited(settings):
    # settings_test lifts the limit for the rest of the suite; the default is 20 in 300 s.
    settings.API_KEY_FAILURE_LIMIT = LIMIT
    settings.API_KEY_FAILURE_WINDOW_SECONDS = 60
    caches[THROTTLE_CACHE].clear()
    yield
    caches[THROTTLE_CACHE].clear()


def _get(key: str, address: str = "127.0.0.1", tenant: str = "acme"):
    return Client().get(calls_url(tenant), HTTP_AUTHORIZATION=f"Bearer {key}", REMOTE_ADDR=address)


def test_the_defaults_are_twenty_failures_in_five_minutes():
    from eventservice import settings as production

    assert (production.API_KEY_FAILURE_LIMIT, production.API_KEY_FAILURE_WINDOW_SECONDS) == (20, 300)


def test_bad_keys_below_the_limit_get_401_and_a_good_key_still_works(world, limited):
    for _ in range(LIMIT - 1):
        assert _get("sa_wrong").status_code == 401
    assert _get(world.acme_key).status_code == 200


def test_past_the_limit_bad_keys_from_that_address_get_429_problem_json(world, limited):
    for _ in range(LIMIT):
        assert _get("sa_wrong").status_code == 401
    response = _get("sa_wrong")
    assert response.status_code == 429
    assert response["Content-Type"] == "application/problem+json"
    assert 0 < int(response["Retry-After"]) <= 60
    body = response.json()
    assert body["type"] == "urn:service-agent:problem:throttled" and body["status"] == 429
    assert "Too many failed API key authentications" in body["detail"]


def test_a_throttled_address_cannot_lock_out_valid_keys(world, limited):
    # Behind a proxy or NAT every tenant shares one address: an anonymous client's bad keys
    # must not refuse the tenants' integrations.
    for _ in range(LIMIT):
        assert _get("sa_wrong").status_code == 401
    assert _get("sa_wrong").status_code == 429
    assert _get(world.acme_key).status_code == 200
    assert _get(world.globex_key, tenant="globex").status_code == 200
    assert _get("sa_wrong").status_code == 429  # a success does not clear the others' count


def test_other_addresses_and_sessions_are_not_affected(world, limited, client):
    for _ in range(LIMIT):
        _get("sa_wrong")
    assert _get(world.acme_key, address="10.0.0.9").status_code == 200
    client.force_login(world.owner)
    assert client.get(calls_url()).status_code == 200


def test_a_malformed_header_counts_as_a_failure(world, limited):
    for _ in range(LIMIT):
        assert Client().get(calls_url(), HTTP_AUTHORIZATION="Bearer a b").status_code == 401
    assert _get("sa_wrong").status_code == 429
    assert _get(world.acme_key).status_code == 200


def test_the_address_may_try_again_when_the_window_ends(world, limited, monkeypatch):
    import time

    for _ in range(LIMIT):
        _get("sa_wrong")
    assert _get("sa_wrong").status_code == 429
    later = time.time() + 61
    monkeypatch.setattr(time, "time", lambda: later)
    assert _get("sa_wrong").status_code == 401
