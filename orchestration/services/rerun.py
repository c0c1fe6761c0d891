"""Rerun: a new call with the same request and retry policy as a stored one."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.conf import settings

from orchestration.models import FAVORITE_TAG, ServiceCall, ServiceCallTag
from orchestration.retries import (
    RetryPolicy,
)
from orchestration.services.calls import call_get
from orchestration.services.submit import service_call_submit
from orchestration.validation import Submission, validate_encodable


def service_call_rerun(
    *, tenant_id: str, service_call_id: uuid.UUID | str, correlation_id: str, due_at: datetime | None = None
) -> ServiceCall:
    """Submit a new call with the same request and retry policy (new id), due at `due_at` (checked by the edge,
    orchestration.validation.validate_rerun; None or past: now); ValidationFailed if the stored
    request holds what validation now refuses."""
    original = call_get(tenant_id, service_call_id)
    spec = original.request_spec
    tags = list(
        ServiceCallTag.objects.filter(tenant_id=tenant_id, service_call=original)
        .exclude(tag=FAVORITE_TAG)
        .order_by("id")
        .values_list("tag", flat=True)
    )
    # A row stored before the rules of docs/security.md §1 may hold what they refuse now (a
    # lone surrogate, a NUL, a body nested too deep): a copy is refused as a new call would be.
    validate_encodable({"name": original.name, "requestSpec": spec, "tags": tags})
    submission = Submission(
        name=original.name,
        method=spec["method"],
        url=spec["url"],
        headers={name: "" for name in spec.get("headers") or {}},  # sealed values copied below
        body=spec.get("body"),
        timeout_ms=spec.get("timeoutMs", settings.EXECUTION_TIMEOUT_MS),
        due_at=due_at,
        tags=tags,
        idempotency_key=None,
        # The same policy: a rerun is the same call made again (docs/retries.md).
        retry_policy=RetryPolicy.from_wire(original.retry_policy) if original.retry_policy else None,
        connection=spec.get("connection"),
    )
    call, _ = service_call_submit(
        tenant_id=tenant_id,
        submission=submission,
        correlation_id=correlation_id,
        rerun_of=original.service_call_id,
        sealed_headers=dict(spec.get("headers") or {}),
    )
    return call
