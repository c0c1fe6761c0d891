"""Calls in known states for page tests, made through orchestration's own services."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall
from orchestration.services import service_call_finish, service_call_start, service_call_submit
from orchestration.validation import validate_submission

TARGET = "http://127.0.0.1:9/never-called"


def submit(
    tenant_id: str,
    name: str = "call",
    *,
    url: str = TARGET,
    tags=(),
    due_in: float | None = 3600,
    headers=None,
    body=None,
    method: str = "GET",
) -> ServiceCall:
    """Store a call as every edge does (validation + service). Due in an hour by default, so it
    stays Scheduled; due_in=None makes it due now (still Scheduled while no engine runs)."""
    spec: dict = {"method": method, "url": url}
    if headers:
        spec["headers"] = headers
    if body is not None:
        spec["body"] = body
    data: dict = {"name": name, "requestSpec": spec, "tags": list(tags)}
    if due_in is not None:
        data["dueAt"] = (datetime.now(UTC) + timedelta(seconds=due_in)).isoformat()
    call, _ = service_call_submit(tenant_id=tenant_id, submission=validate_submission(data), correlation_id="test-corr")
    return call


def succeeded(
    tenant_id: str, name: str = "ok call", *, body: str = '{"hello":"world","n":[1,2]}', **kwargs
) -> ServiceCall:
    call = submit(tenant_id, name, due_in=None, **kwargs)
    assert service_call_start(tenant_id=tenant_id, service_call_id=call.pk) is not None
    outcome = Outcome(
        succeeded=True,
        status=200,
        headers={"Content-Type": "application/json", "X-Served-By": "target-7"},
        body_snippet=body,
        latency_ms=42,
    )
    assert service_call_finish(tenant_id=tenant_id, service_call_id=call.pk, outcome=outcome)
    return ServiceCall.objects.get(pk=call.pk)


def failed(tenant_id: str, name: str = "failing call", **kwargs) -> ServiceCall:
    call = submit(tenant_id, name, due_in=None, **kwargs)
    assert service_call_start(tenant_id=tenant_id, service_call_id=call.pk) is not None
    outcome = Outcome.failure(
        ErrorKind.HTTP_ERROR, "The target answered 503 Service Unavailable.", status=503, latency_ms=17
    )
    assert service_call_finish(tenant_id=tenant_id, service_call_id=call.pk, outcome=outcome)
    return ServiceCall.objects.get(pk=call.pk)
