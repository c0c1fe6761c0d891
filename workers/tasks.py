"""django-q2 tasks: thin, fetch by id, call a service, idempotent under redelivery."""

from __future__ import annotations

import uuid

from orchestration.services import CallKey
from workers.pipeline import run_now
from workers.signals import current_worker_id


def run_due_call(tenant_id: str, service_call_id: str) -> int:
    """Start and execute a call that was due at submission, without waiting for a timer poll
    (docs/architecture.md, 'The path of one call', step 1).

    Redelivered, or raced by the engine's timer, the start finds nothing Scheduled and this
    does nothing.
    """
    return run_now([CallKey(tenant_id, uuid.UUID(service_call_id))], worker_id=current_worker_id())
