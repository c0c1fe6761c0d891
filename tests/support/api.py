"""The REST API from a test: a JSON client with an optional API key, the URLs, a valid
submission payload, a submission through HTTP and the problem+json check."""

from __future__ import annotations

import copy
import json
from typing import Any

from django.test import Client

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from timer.models import TimerSchedule

BASE = "/api/tenants/{tenant}/service-calls"


def calls_url(tenant: str = "acme") -> str:
    return BASE.format(tenant=tenant)


def call_url(call_id: Any, tenant: str = "acme", suffix: str = "") -> str:
    return f"{calls_url(tenant)}/{call_id}{suffix}"


def valid_payload(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "name": "Ping the billing service",
        "requestSpec": {
            "method": "POST",
            "url": "http://127.0.0.1:9/hook",
            "headers": {"Content-Type": "application/json", "X-Trace": "t-1"},
            "body": {"hello": "world"},
            "timeoutMs": 5000,
        },
        "tags": ["billing", "nightly"],
    }
    for key, value in overrides.items():
        if key == "spec":
            payload["requestSpec"].update(value)
        else:
            payload[key] = value
    return copy.deepcopy(payload)


class ApiClient:
    """A Django test client speaking JSON with an optional API key."""

    def __init__(self, key: str | None = None, client: Client | None = None) -> None:
        self.client = client or Client()
        self.key = key

    def _headers(self, headers: dict[str, str] | None) -> dict[str, str]:
        merged = dict(headers or {})
        if self.key is not None:
            merged.setdefault("Authorization", f"Bearer {self.key}")
        return merged

    def get(self, url: str, data: Any = None, headers: dict[str, str] | None = None):
        return self.client.get(url, data, headers=self._headers(headers))

    def post(self, url: str, payload: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None):
        body = raw if raw is not None else (json.dumps(payload) if payload is not None else "")
        return self.client.post(url, body, content_type="application/json", headers=self._headers(headers))

    def put(self, url: str, payload: Any = None, headers: dict[str, str] | None = None):
        body = json.dumps(payload) if payload is not None else ""
        return self.client.put(url, body, content_type="application/json", headers=self._headers(headers))

    def patch(self, url: str, payload: Any = None, headers: dict[str, str] | None = None):
        body = json.dumps(payload) if payload is not None else ""
        return self.client.patch(url, body, content_type="application/json", headers=self._headers(headers))

    def delete(self, url: str, headers: dict[str, str] | None = None):
        return self.client.delete(url, headers=self._headers(headers))


def session_api(user) -> ApiClient:
    client = Client()
    client.force_login(user)
    return ApiClient(None, client)


def submit_via_api(api: ApiClient, tenant: str = "acme", **overrides: Any) -> dict[str, Any]:
    """POST valid_payload(**overrides) to the tenant's list; returns the 202 body."""
    response = api.post(calls_url(tenant), valid_payload(**overrides))
    assert response.status_code == 202, response.content
    return response.json()


def stored_counts() -> tuple[int, int, int]:
    return ServiceCall.objects.count(), OutboxEvent.objects.count(), TimerSchedule.objects.count()


def assert_problem(response, status: int, *, errors_for: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    for key in ("type", "title", "detail", "correlationId"):
        assert body.get(key), f"problem without {key}: {body}"
    assert body["correlationId"] == response["X-Correlation-Id"]
    if errors_for is not None:
        assert errors_for in body["errors"], body
        assert all(isinstance(m, str) for m in body["errors"][errors_for])
    return body
