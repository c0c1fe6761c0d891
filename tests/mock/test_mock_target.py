"""The built-in mock target at /mock/ (docs/commands.md), and the egress decision that lets calls reach it."""

import time

import pytest
from django.test import Client, override_settings

from eventservice.mock import views
from execution.egress import EgressDenied, EgressPolicy


@pytest.fixture
def client():
    # CSRF checks on: the mock must answer any method without a token.
    return Client(enforce_csrf_checks=True)


def test_the_index_lists_the_routes(client):
    response = client.get("/mock/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body["routes"]) == {
        "/mock/",
        "/mock/echo",
        "/mock/echo/<anything>",
        "/mock/status/<code>",
        "/mock/delay/<ms>",
        "/mock/json",
    }
    assert set(body["queryOptions"]) == {"status", "delay"}


def test_echo_answers_method_path_query_headers_and_body(client):
    response = client.post(
        "/mock/echo/orders/7?a=1&a=2&b=x",
        data='{"id": 7}',
        content_type="application/json",
        HTTP_ACCEPT="application/json",
        HTTP_X_TRACE="t-1",
    )
    assert response.status_code == 200
    body = response.json()
    assert body["method"] == "POST"
    assert body["path"] == "/mock/echo/orders/7"
    assert body["query"] == {"a": ["1", "2"], "b": ["x"]}
    assert body["headers"]["Accept"] == "application/json"
    assert body["headers"]["X-Trace"] == "t-1"
    assert body["body"] == '{"id": 7}'
    assert body["json"] == {"id": 7}
    assert body["bodyTruncated"] is False


def test_echo_redacts_secret_header_values(client):
    response = client.get(
        "/mock/echo",
        HTTP_AUTHORIZATION="Bearer s3cret",
        HTTP_X_API_KEY="k3y",
        HTTP_COOKIE="session=abc",
        HTTP_X_AUTH_TOKEN="t0ken",
    )
    body = response.json()
    assert body["headers"]["Authorization"] == "***"
    assert body["headers"]["X-Api-Key"] == "***"
    assert body["headers"]["Cookie"] == "***"
    assert body["headers"]["X-Auth-Token"] == "***"
    for secret in ("s3cret", "k3y", "abc", "t0ken"):
        assert secret not in response.content.decode()


@pytest.mark.parametrize("method", ["put", "patch", "delete", "options"])
def test_echo_answers_any_method_without_a_csrf_token(client, method):
    response = getattr(client, method)("/mock/echo", data="plain text", content_type="text/plain")
    assert response.status_code == 200
    body = response.json()
    assert body["method"] == method.upper()
    assert body["body"] == "plain text"
    assert body["json"] is None


def test_echo_reads_at_most_64_kib_of_the_body(client):
    response = client.post("/mock/echo", data="x" * (100 * 1024), content_type="text/plain")
    body = response.json()
    assert body["bodyTruncated"] is True
    assert len(body["body"]) == views.MAX_BODY_BYTES == 64 * 1024


@pytest.mark.parametrize("code", [200, 201, 400, 404, 429, 500, 503, 599])
def test_status_answers_the_chosen_status_with_a_json_body(client, code):
    response = client.post(f"/mock/status/{code}")
    assert response.status_code == code
    assert response.json() == {"status": code}


@pytest.mark.parametrize("code", [204, 304])
def test_status_without_a_body_sends_none(client, code):
    response = client.get(f"/mock/status/{code}")
    assert response.status_code == code
    assert response.content == b""


@pytest.mark.parametrize("code", [0, 99, 600, 1000])
def test_status_refuses_codes_outside_100_to_599(client, code):
    response = client.get(f"/mock/status/{code}")
    assert response.status_code == 400
    assert response.json() == {"error": "The status must be from 100 to 599."}


def test_delay_waits_then_answers_200(client):
    started = time.monotonic()
    response = client.get("/mock/delay/150")
    assert time.monotonic() - started >= 0.15
    assert response.status_code == 200
    assert response.json() == {"requestedMs": 150, "delayedMs": 150}


def test_delay_is_capped(client, monkeypatch):
    # The cap is 10 s; a small one keeps the test quick while checking the same code path.
    monkeypatch.setattr(views, "MAX_DELAY_MS", 50)
    started = time.monotonic()
    response = client.get("/mock/delay/3600000")
    assert time.monotonic() - started < 2
    assert response.json() == {"requestedMs": 3600000, "delayedMs": 50}


def test_delays_are_capped_at_ten_seconds():
    assert views.MAX_DELAY_MS == 10_000


@override_settings(MOCK_DELAY_CONCURRENCY=1)
def test_a_delayed_answer_beyond_the_slots_gets_503_at_once(client):
    slots = views._delay_slots()
    assert slots.acquire(blocking=False)  # another request is sleeping in the only slot
    try:
        started = time.monotonic()
        response = client.get("/mock/delay/5000")
        assert time.monotonic() - started < 1
        assert response.status_code == 503
        assert response["Retry-After"] == "10"
        assert "busy" in response.json()["error"]
        # Answers without a delay need no slot.
        assert client.get("/mock/json").status_code == 200
    finally:
        slots.release()
    assert client.get("/mock/echo?delay=20").status_code == 200


@override_settings(MOCK_DELAY_CONCURRENCY=1)
def test_a_slot_is_given_back_when_the_answer_is_sent(client):
    for _ in range(3):
        assert client.get("/mock/delay/10").status_code == 200
    assert views._delay_slots().acquire(blocking=False)
    views._delay_slots().release()


@override_settings(MOCK_TARGET_ENABLED=False)
@pytest.mark.parametrize(
    "path", ["/mock/", "/mock/echo", "/mock/echo/a/b", "/mock/status/200", "/mock/delay/5000", "/mock/json"]
)
def test_turned_off_every_route_answers_404_at_once(client, path):
    started = time.monotonic()
    response = client.post(path)
    assert response.status_code == 404
    assert time.monotonic() - started < 1


def test_json_answers_the_fixed_document(client):
    response = client.delete("/mock/json")
    assert response.status_code == 200
    assert response.json() == views.FIXED_DOCUMENT
    assert response.json()["order"]["total"] == 57.0


def test_query_options_combine_status_and_delay(client):
    started = time.monotonic()
    response = client.post("/mock/echo?status=201&delay=200", data="{}", content_type="application/json")
    assert time.monotonic() - started >= 0.2
    assert response.status_code == 201
    body = response.json()
    assert body["delayedMs"] == 200
    assert body["query"] == {"status": ["201"], "delay": ["200"]}


@pytest.mark.parametrize("query", ["status=abc", "status=99", "status=600", "delay=-1", "delay=10001", "delay=1.5"])
def test_query_options_out_of_range_are_refused(client, query):
    started = time.monotonic()
    response = client.get(f"/mock/json?{query}")
    assert response.status_code == 400
    assert "must be an integer" in response.json()["error"]
    assert time.monotonic() - started < 1


def test_no_login_is_needed(client):
    assert client.get("/mock/json").status_code == 200  # an anonymous client


@override_settings(EGRESS_ALLOWLIST=[], AGENT_BASE_URL="http://127.0.0.1:8000")
def test_the_default_egress_policy_allows_the_agents_own_mock_target():
    policy = EgressPolicy.from_settings()
    # Decision level only: resolving an address literal sends nothing.
    target = policy.resolve("http://127.0.0.1:8000/mock/echo")
    assert (target.address, target.port) == ("127.0.0.1", 8000)
    assert str(policy.check_address("127.0.0.1", 8000, "127.0.0.1", path="/mock/echo")) == "127.0.0.1"


@override_settings(EGRESS_ALLOWLIST=[], AGENT_BASE_URL="http://127.0.0.1:8000")
def test_the_default_egress_policy_still_refuses_other_loopback_ports():
    policy = EgressPolicy.from_settings()
    with pytest.raises(EgressDenied):
        policy.check_address("127.0.0.1", 8001, "127.0.0.1")
    with pytest.raises(EgressDenied):
        policy.check_address("127.0.0.2", 8000, "127.0.0.2")


@override_settings(EGRESS_ALLOWLIST=[], AGENT_BASE_URL="http://localhost:8123")
def test_a_localhost_base_url_allows_both_loopback_addresses_on_its_port():
    policy = EgressPolicy.from_settings()
    assert str(policy.check_address("localhost", 8123, "127.0.0.1", path="/mock/json")) == "127.0.0.1"
    assert str(policy.check_address("localhost", 8123, "::1", path="/mock/json")) == "::1"
    with pytest.raises(EgressDenied):
        policy.check_address("localhost", 8000, "127.0.0.1")
