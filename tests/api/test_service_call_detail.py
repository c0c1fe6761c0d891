"""GET /api/tenants/{tenantId}/service-calls/{id}: the call, its attempts and its events."""

from __future__ import annotations

import json

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.api import ApiClient, assert_problem, call_url, calls_url, submit_via_api, valid_payload
from tests.support.waiting import wait_for

SECRETS = {
    "Authorization": "Bearer top-secret-token-1",
    "X-Api-Key": "top-secret-key-2",
    "Cookie": "session=top-secret-cookie-3",
}


def test_it_shows_a_scheduled_call_with_its_events_and_no_attempts(acme_api):
    created = submit_via_api(acme_api)

    response = acme_api.get(call_url(created["serviceCallId"]))

    assert response.status_code == 200
    body = response.json()
    assert {k: v for k, v in body.items() if k not in ("executions", "events")} == created
    assert body["executions"] == []
    assert [e["type"] for e in body["events"]] == ["ServiceCallSubmitted", "ServiceCallScheduled"]
    rows = list(OutboxEvent.objects.filter(aggregate_id=created["serviceCallId"]).order_by("id"))
    first = body["events"][0]
    assert first["id"] == str(rows[0].event_id) and first["sequence"] == rows[0].id
    assert first["aggregateId"] == created["serviceCallId"] and first["tenantId"] == "acme"
    assert first["publishedAt"] is None
    assert first["payload"]["name"] == "Ping the billing service"


def test_an_unknown_or_malformed_id_is_404(acme_api, world):
    assert_problem(acme_api.get(call_url("0190a000-0000-7000-8000-000000000000")), 404)
    assert_problem(acme_api.get(call_url("not-a-uuid")), 404)


def test_a_finished_call_shows_outcome_attempts_and_published_events(world, http_target, engine):
    api = ApiClient(world.acme_key)
    created = api.post(
        calls_url(), valid_payload(spec={"url": http_target.url("/json"), "method": "GET", "body": None})
    ).json()
    call_id = created["serviceCallId"]
    wait_for(lambda: ServiceCall.objects.get(pk=call_id).is_terminal)
    wait_for(lambda: not OutboxEvent.objects.filter(aggregate_id=call_id, published_at__isnull=True).exists())

    body = api.get(call_url(call_id)).json()

    assert body["status"] == "Succeeded"
    assert body["startedAt"].endswith("Z") and body["finishedAt"].endswith("Z")
    meta = body["outcome"]["responseMeta"]
    assert meta["status"] == 200 and '"hello"' in meta["bodySnippet"] and meta["latencyMs"] >= 0
    [attempt] = body["executions"]
    assert attempt["attempt"] == 1 and attempt["state"] == "Finished"
    assert attempt["request"]["method"] == "GET" and attempt["request"]["url"] == http_target.url("/json")
    assert attempt["response"]["status"] == 200 and attempt["error"] is None
    assert [e["type"] for e in body["events"]] == [
        "ServiceCallSubmitted",
        "ServiceCallScheduled",
        "ServiceCallRunning",
        "ServiceCallSucceeded",
    ]
    assert all(e["publishedAt"] and e["publishedAt"].endswith("Z") for e in body["events"])


def test_secret_header_values_never_appear_in_any_api_response(world, http_target, engine):
    api = ApiClient(world.acme_key)
    payload = valid_payload(
        spec={"url": http_target.url("/ok"), "headers": {**SECRETS, "X-Plain": "visible"}}, tags=["secret-test"]
    )
    created = api.post(calls_url(), payload)
    call_id = created.json()["serviceCallId"]
    wait_for(lambda: ServiceCall.objects.get(pk=call_id).is_terminal)
    wait_for(lambda: not OutboxEvent.objects.filter(aggregate_id=call_id, published_at__isnull=True).exists())
    # The target really received the secrets: redaction is on the way out, not on the wire.
    sent = http_target.requests[-1]["headers"]
    assert sent["Authorization"] == SECRETS["Authorization"] and sent["X-Api-Key"] == SECRETS["X-Api-Key"]

    responses = [
        created,
        api.get(call_url(call_id)),
        api.get(calls_url()),
        api.get(calls_url(), {"tag": "secret-test"}),
        api.put(call_url(call_id, suffix="/tags"), {"tags": ["secret-test", "again"]}),
        api.post(call_url(call_id, suffix="/rerun")),
        api.get("/api/tenants/acme/events"),
    ]
    for response in responses:
        assert response.status_code in (200, 202), response.content
        text = response.content.decode()
        for secret in SECRETS.values():
            assert secret not in text and secret.split("=")[-1] not in text
    detail = api.get(call_url(call_id)).json()
    assert detail["requestSpec"]["headers"] == {
        "Authorization": "***",
        "X-Api-Key": "***",
        "Cookie": "***",
        "X-Plain": "visible",
    }
    assert detail["executions"][0]["request"]["headers"]["Authorization"] == "***"
    assert "visible" in json.dumps(detail)
