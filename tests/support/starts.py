"""Starting calls as the engine does (the timer, the backlog loop, the flow loop all go
through orchestration.services.service_calls_start), for tests of what a start decides."""

from __future__ import annotations

from orchestration.models import ServiceCall
from orchestration.services import CallKey, service_calls_start


def start(*rows: ServiceCall) -> list[str]:
    """Start the calls in one start; the names of those that started, sorted."""
    started = service_calls_start(keys=[CallKey(row.tenant_id, row.pk) for row in rows])
    names = {row.pk: row.name for row in rows}
    return sorted(names[call.service_call_id] for call in started)


def fresh(row: ServiceCall) -> ServiceCall:
    """The call's row as stored now."""
    return ServiceCall.objects.get(pk=row.pk)
