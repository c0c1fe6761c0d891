"""Read models that combine domains, at the edge: a call (orchestration) with its attempts
(execution), its events (outbox) and each event's deliveries (delivery). Each domain's own
representation stays in its app (orchestration.representation, delivery.representation); only
what joins them lives here, above them all (docs/architecture.md, "Layers")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from delivery.models import Notification
from delivery.representation import call_event_delivery_representation
from delivery.selectors import deliveries_for_call
from execution.models import HttpExecution
from orchestration.models import ServiceCall
from orchestration.representation import event_representation, execution_representation, service_call_representation
from outbox.models import OutboxEvent


def service_call_detail_representation(
    call: ServiceCall,
    *,
    executions: Iterable[HttpExecution],
    events: Iterable[OutboxEvent],
    deliveries: dict[Any, list[Notification]] | None = None,
    request: Any = None,
) -> dict[str, Any]:
    """The call with its attempt log and its events, each with its `deliveries` to the tenant's
    own subscriptions: `deliveries` maps an event id to its notifications
    (delivery.selectors.deliveries_for_call, one query for the whole call; read here if not given)."""
    if deliveries is None:
        deliveries = deliveries_for_call(tenant_id=call.tenant_id, service_call_id=call.service_call_id)
    return {
        **service_call_representation(call, request=request),
        "executions": [execution_representation(row) for row in executions],
        "events": [
            {
                **event_representation(row),
                "deliveries": [call_event_delivery_representation(n) for n in deliveries.get(row.event_id, [])],
            }
            for row in events
        ],
    }
