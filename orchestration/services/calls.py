"""What the transitions of service calls share: the keys of a call and of a started one, the
request spec as it may be shown, the event a transition appends, a call read by tenant, the
immediate start enqueued on commit.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.conf import settings

from core.errors import NotFound
from core.secrets import redact_headers
from orchestration.models import ServiceCall
from outbox.services import NewEvent

logger = logging.getLogger(__name__)


EVENT_BODY_SNIPPET = 1024


@dataclass(frozen=True)
class CallKey:
    tenant_id: str
    service_call_id: uuid.UUID
    # For an outcome: the attempt it belongs to. A finish for any other attempt than the
    # call's current one changes nothing.
    attempt: int | None = None


class Occurrence(NamedTuple):
    """Marks the call a schedule makes: which schedule, which of its occurrences, and the
    schedule's overlap policy the call carries (orchestration.services.overlap)."""

    schedule_id: uuid.UUID
    at: datetime
    overlap: str = "skip"


@dataclass(frozen=True)
class StartedCall:
    """A call that just turned Running: what execution needs to perform its attempt."""

    tenant_id: str
    service_call_id: uuid.UUID
    correlation_id: str
    method: str
    url: str
    headers: dict[str, str]  # plaintext, for the wire only
    body: Any
    timeout_ms: int
    attempt: int = 1
    # Flow control's rate may admit a call a moment before it starts: not sent before then.
    not_before: datetime | None = None
    # The tenant's connection whose credentials each attempt carries (docs/connections.md).
    connection: str | None = None

    @property
    def key(self) -> CallKey:
        return CallKey(self.tenant_id, self.service_call_id, self.attempt)


def public_request_spec(spec: dict[str, Any], *, body_limit: int | None = None) -> dict[str, Any]:
    """The request spec as it may be shown: secret header values redacted."""
    body = spec.get("body")
    if body_limit is not None and body is not None:
        text = body if isinstance(body, str) else json.dumps(body)
        if len(text) > body_limit:
            body = text[:body_limit]
    return {
        "method": spec["method"],
        "url": spec["url"],
        "headers": redact_headers(spec.get("headers")),
        "body": body,
        "timeoutMs": spec.get("timeoutMs", settings.EXECUTION_TIMEOUT_MS),
        **({"connection": spec["connection"]} if spec.get("connection") else {}),
    }


def call_event(
    call: ServiceCall, type_: str, payload: dict[str, Any], at: datetime, causation_id: str | None = None
) -> NewEvent:
    return NewEvent(
        tenant_id=call.tenant_id,
        aggregate_id=call.service_call_id,
        type=type_,
        payload={"serviceCallId": str(call.service_call_id), **payload},
        correlation_id=call.correlation_id,
        causation_id=causation_id,
        at=at,
    )


def call_get(tenant_id: str, service_call_id: uuid.UUID | str) -> ServiceCall:
    call = ServiceCall.objects.filter(tenant_id=tenant_id, pk=service_call_id).first()
    if call is None:
        raise NotFound(f"Service call {service_call_id} not found.")
    return call


def enqueue_start(tenant_id: str, service_call_id: uuid.UUID) -> None:
    from django_q.tasks import async_task

    try:
        async_task("workers.tasks.run_due_call", tenant_id, str(service_call_id), q_options={"timeout": 150})
    except Exception:  # the durable timer still fires it; the enqueue is only a shortcut
        logger.warning(
            "could not enqueue immediate start",
            exc_info=True,
            extra={"tenantId": tenant_id, "serviceCallId": str(service_call_id)},
        )
