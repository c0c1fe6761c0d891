"""POST /api/tenants/{tenantId}/service-calls: accept, refuse bad input, idempotency."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestration.models import ServiceCall, ServiceCallTag
from outbox.models import OutboxEvent
from tests.support.api import assert_problem, calls_url, stored_counts, valid_payload
from timer.models import TimerSchedule


def test_it_accepts_a_call_with_202_location_and_the_representation(acme_api):
    response = acme_api.post(calls_url(), valid_payload())

    assert response.status_code == 202
    body = response.json()
    assert response["Location"] == body["links"]["self"]
    assert response["Location"].startswith("http://testserver/api/tenants/acme/service-calls/")
    assert list(body) == [
        "serviceCallId",
        "tenantId",
        "name",
        "status",
        "submittedAt",
        "dueAt",
        "startedAt",
        "finishedAt",
        "requestSpec",
        "tags",
        "favorite",
        "outcome",
        "attempt",
        "retryPolicy",
        "nextAttemptAt",
        "lastError",
        "scheduleId",
        "occurrenceAt",
        "overlap",
        "overlapState",
        "heldSince",
        "heldMs",
        "correlationId",
        "links",
    ]
    call = ServiceCall.objects.get(pk=body["serviceCallId"])
    assert call.tenant_id == "acme" and body["tenantId"] == "acme"
    assert call.status == ServiceCall.Status.SCHEDULED == body["status"]
    assert call.name == body["name"] == "Ping the billing service"
    assert sorted(ServiceCallTag.objects.filter(service_call=call).values_list("tag", flat=True)) == [
        "billing",
        "nightly",
    ]
    assert body["requestSpec"] == {
        "method": "POST",
        "url": "http://127.0.0.1:9/hook",
        "headers": {"Content-Type": "application/json", "X-Trace": "t-1"},
        "body": {"hello": "world"},
        "timeoutMs": 5000,
    }
    assert body["favorite"] is False and body["outcome"] is None
    assert body["correlationId"] == response["X-Correlation-Id"] == call.correlation_id
    assert set(body["links"]) >= {"self", "tags", "rerun", "events"}
    assert OutboxEvent.objects.filter(aggregate_id=call.pk).count() == 2
    assert TimerSchedule.objects.filter(service_call=call).count() == 1


def test_times_are_iso_utc_with_milliseconds_and_z(acme_api):
    due = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=123456)
    body = acme_api.post(calls_url(), valid_payload(dueAt=due.isoformat())).json()

    assert body["dueAt"] == due.strftime("%Y-%m-%dT%H:%M:%S.123Z")
    assert body["submittedAt"].endswith("Z") and len(body["submittedAt"]) == len("2024-01-01T00:00:00.000Z")
    assert ServiceCall.objects.get(pk=body["serviceCallId"]).due_at == due


def test_timeout_defaults_to_the_configured_execution_timeout(acme_api, settings):
    payload = valid_payload()
    del payload["requestSpec"]["timeoutMs"]
    body = acme_api.post(calls_url(), payload).json()

    assert body["requestSpec"]["timeoutMs"] == settings.EXECUTION_TIMEOUT_MS
    assert ServiceCall.objects.get(pk=body["serviceCallId"]).request_spec["timeoutMs"] == 30000


def test_a_correlation_id_sent_by_the_client_is_echoed_and_stored(acme_api):
    response = acme_api.post(calls_url(), valid_payload(), headers={"X-Correlation-Id": "client-corr-42"})

    assert response["X-Correlation-Id"] == "client-corr-42"
    assert ServiceCall.objects.get(pk=response.json()["serviceCallId"]).correlation_id == "client-corr-42"


def test_an_invalid_correlation_id_is_replaced_by_a_new_one(acme_api):
    response = acme_api.post(calls_url(), valid_payload(), headers={"X-Correlation-Id": "bad id with spaces"})

    minted = response["X-Correlation-Id"]
    assert minted and minted != "bad id with spaces"
    assert ServiceCall.objects.get(pk=response.json()["serviceCallId"]).correlation_id == minted


# --- Every invalid input -> 400 problem with field errors and nothing stored -----------------
# (docs/security.md §1, "Input is validated at the edge")


def _headers(n: int) -> dict[str, str]:
    return {f"X-H{i}": "v" for i in range(n)}


INVALID = [
    ("empty name", {"name": ""}, "name"),
    ("name of 201 characters", {"name": "n" * 201}, "name"),
    ("relative url", {"spec": {"url": "/relative/path"}}, "requestSpec.url"),
    ("ftp url", {"spec": {"url": "ftp://example.com/file"}}, "requestSpec.url"),
    ("url longer than 2048", {"spec": {"url": "http://example.com/" + "a" * 2040}}, "requestSpec.url"),
    ("url with credentials", {"spec": {"url": "http://user:pw@example.com/"}}, "requestSpec.url"),
    ("header name not a token", {"spec": {"headers": {"Bad Header": "v"}}}, "requestSpec.headers"),
    ("header value with CR/LF", {"spec": {"headers": {"X-Evil": "a\r\nInjected: yes"}}}, "requestSpec.headers"),
    ("51 headers", {"spec": {"headers": _headers(51)}}, "requestSpec.headers"),
    ("body over 256 KiB", {"spec": {"body": "x" * (256 * 1024 + 1)}}, "requestSpec.body"),
    ("21 tags", {"tags": [f"t{i}" for i in range(21)]}, "tags"),
    ("tag with whitespace", {"tags": ["two words"]}, "tags"),
    ("tag of 65 characters", {"tags": ["t" * 65]}, "tags"),
    ("dueAt without a zone", {"dueAt": "2030-01-01T10:00:00"}, "dueAt"),
    ("dueAt more than a year ahead", {"dueAt": (datetime.now(UTC) + timedelta(days=400)).isoformat()}, "dueAt"),
    ("timeoutMs 0", {"spec": {"timeoutMs": 0}}, "requestSpec.timeoutMs"),
    ("timeoutMs 120001", {"spec": {"timeoutMs": 120001}}, "requestSpec.timeoutMs"),
    ("method TRACE", {"spec": {"method": "TRACE"}}, "requestSpec.method"),
    ("Host header", {"spec": {"headers": {"Host": "evil.example"}}}, "requestSpec.headers"),
    ("unknown top-level field", {"extra": 1}, "body"),
]


@pytest.mark.parametrize(("case", "overrides", "field"), INVALID, ids=[case for case, _, _ in INVALID])
def test_it_refuses_invalid_input_with_field_errors_and_stores_nothing(acme_api, case, overrides, field):
    before = stored_counts()

    response = acme_api.post(calls_url(), valid_payload(**overrides))

    body = assert_problem(response, 400, errors_for=field)
    assert body["type"].endswith("validation-error")
    assert stored_counts() == before


def test_the_limits_themselves_are_accepted(acme_api):
    payload = valid_payload(
        name="n" * 200,
        tags=[f"t{i}" for i in range(19)] + ["t" * 64],
        spec={"headers": _headers(50), "timeoutMs": 120000, "body": "x" * (256 * 1024)},
    )
    response = acme_api.post(calls_url(), payload)

    assert response.status_code == 202, response.content
    call = ServiceCall.objects.get(pk=response.json()["serviceCallId"])
    assert len(call.name) == 200 and len(call.request_spec["headers"]) == 50


def test_it_refuses_a_body_that_is_not_json_with_400_and_stores_nothing(acme_api):
    before = stored_counts()

    response = acme_api.post(calls_url(), raw=b'{"name": "x", ')

    body = assert_problem(response, 400)
    assert body["type"].endswith("malformed-request")
    assert stored_counts() == before


def test_it_refuses_a_json_array_body(acme_api):
    before = stored_counts()
    assert_problem(acme_api.post(calls_url(), [1, 2]), 400, errors_for="body")
    assert stored_counts() == before


def test_it_refuses_a_request_body_over_the_upload_limit_with_413(acme_api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 300 * 1024
    before = stored_counts()
    payload = valid_payload(spec={"body": "x" * (400 * 1024)})

    response = acme_api.post(calls_url(), payload)

    body = assert_problem(response, 413)
    assert body["type"].endswith("payload-too-large")
    assert stored_counts() == before


def test_the_default_upload_limit_refuses_a_very_large_body_with_413(acme_api, settings):
    before = stored_counts()
    oversized = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1
    response = acme_api.post(calls_url(), raw=b'{"name": "' + b"x" * oversized + b'"}')

    assert_problem(response, 413)
    assert stored_counts() == before


def test_it_refuses_a_form_encoded_body_with_415(acme_api):
    response = acme_api.client.post(calls_url(), {"name": "x"}, headers={"Authorization": f"Bearer {acme_api.key}"})
    assert_problem(response, 415)


# --- Idempotency ----------------------------------------------------------------------------


def test_the_same_idempotency_key_and_payload_answers_200_with_the_existing_call(acme_api):
    first = acme_api.post(calls_url(), valid_payload(idempotencyKey="order-7"))
    again = acme_api.post(calls_url(), valid_payload(idempotencyKey="order-7"))

    assert first.status_code == 202
    assert again.status_code == 200
    assert again.json()["serviceCallId"] == first.json()["serviceCallId"]
    assert again["Location"] == first["Location"]
    assert ServiceCall.objects.filter(tenant_id="acme", idempotency_key="order-7").count() == 1
    assert OutboxEvent.objects.count() == 2


def test_the_idempotency_key_header_works_like_the_body_field(acme_api):
    first = acme_api.post(calls_url(), valid_payload(), headers={"Idempotency-Key": "hdr-1"})
    again = acme_api.post(calls_url(), valid_payload(idempotencyKey="hdr-1"))

    assert first.status_code == 202 and again.status_code == 200
    assert ServiceCall.objects.get().idempotency_key == "hdr-1"


def test_the_same_idempotency_key_with_another_payload_answers_409(acme_api):
    first = acme_api.post(calls_url(), valid_payload(idempotencyKey="order-8"))
    before = stored_counts()

    response = acme_api.post(calls_url(), valid_payload(idempotencyKey="order-8", name="Something else"))

    body = assert_problem(response, 409)
    assert body["type"].endswith("conflict")
    assert stored_counts() == before
    assert ServiceCall.objects.get(idempotency_key="order-8").pk.hex == first.json()["serviceCallId"].replace("-", "")


def test_idempotency_keys_are_per_tenant(acme_api, globex_api):
    mine = acme_api.post(calls_url("acme"), valid_payload(idempotencyKey="shared-key"))
    theirs = globex_api.post(calls_url("globex"), valid_payload(idempotencyKey="shared-key", name="Other"))

    assert mine.status_code == 202 and theirs.status_code == 202
    assert ServiceCall.objects.filter(idempotency_key="shared-key").count() == 2
