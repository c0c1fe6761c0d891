"""Calls in known states for page tests, made through orchestration's own services."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from execution.http import HttpRequest
from execution.outcomes import ErrorKind, Outcome
from execution.services import AttemptOrder, attempts_begin, attempts_finish
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


def _run(tenant_id: str, call: ServiceCall, outcome: Outcome) -> ServiceCall:
    """What the engine does around the HTTP request: start, log the attempt, finish."""
    started = service_call_start(tenant_id=tenant_id, service_call_id=call.pk)
    assert started is not None
    request = HttpRequest(
        method=started.method,
        url=started.url,
        headers=started.headers,
        body=started.body,
        timeout_ms=started.timeout_ms,
    )
    order = AttemptOrder(
        tenant_id=tenant_id, service_call_id=call.pk, correlation_id=started.correlation_id, request=request
    )
    attempts = attempts_begin(orders=[order], worker_id="test-worker-1")
    attempts_finish(results=[(attempts[0], outcome)])
    assert service_call_finish(tenant_id=tenant_id, service_call_id=call.pk, outcome=outcome)
    return ServiceCall.objects.get(pk=call.pk)


def succeeded(
    tenant_id: str, name: str = "ok call", *, body: str = '{"hello":"world","n":[1,2]}', **kwargs
) -> ServiceCall:
    call = submit(tenant_id, name, due_in=None, **kwargs)
    outcome = Outcome(
        succeeded=True,
        status=200,
        headers={"Content-Type": "application/json", "X-Served-By": "target-7"},
        body_snippet=body,
        latency_ms=42,
    )
    return _run(tenant_id, call, outcome)


def failed(tenant_id: str, name: str = "failing call", **kwargs) -> ServiceCall:
    call = submit(tenant_id, name, due_in=None, **kwargs)
    outcome = Outcome.failure(
        ErrorKind.HTTP_ERROR, "The target answered 503 Service Unavailable.", status=503, latency_ms=17
    )
    return _run(tenant_id, call, outcome)
