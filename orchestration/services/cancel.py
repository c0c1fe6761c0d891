"""Cancel: Scheduled -> Cancelled, the call's timer discarded (docs/retries.md, 'Cancel')."""

from __future__ import annotations

import uuid

from django.db import transaction

from core.errors import Conflict
from core.ids import iso_ms, utcnow
from orchestration.admission import held_since_cleared_on_cancel
from orchestration.models import ServiceCall
from orchestration.services.calls import call_event, call_get
from orchestration.services.overlap import overlap_release
from outbox.models import OutboxEvent
from outbox.services import outbox_append
from timer.services import timers_discard


def service_call_cancel(
    *, tenant_id: str, service_call_id: uuid.UUID | str, correlation_id: str | None = None
) -> ServiceCall:
    """Scheduled -> Cancelled: the call never starts, its timer is discarded. Cancelling a
    Cancelled call changes nothing; a Running or finished call raises Conflict naming its status.

    The conditional update races the timer's start fairly: whichever commits first wins, and
    the other finds the call no longer Scheduled (docs/retries.md, 'Cancel').
    """
    with transaction.atomic():
        call = call_get(tenant_id, service_call_id)
        now = utcnow()
        changed = ServiceCall.objects.filter(
            pk=call.service_call_id, tenant_id=tenant_id, status=ServiceCall.Status.SCHEDULED
        ).update(status=ServiceCall.Status.CANCELLED, finished_at=now, **held_since_cleared_on_cancel(call, now=now))
        call.refresh_from_db()
        if not changed:
            if call.status == ServiceCall.Status.CANCELLED:
                return call
            raise Conflict(
                f"Service call {call.service_call_id} is {call.status}; only a Scheduled call can be cancelled."
            )
        timers_discard(keys=[(tenant_id, call.service_call_id)])
        if call.schedule_id is not None:  # it may have been going: the call one buffers may start
            overlap_release([(tenant_id, call.schedule_id)], now=now)
        outbox_append(
            events=[
                call_event(
                    call,
                    OutboxEvent.Type.CANCELLED,
                    {"cancelledAt": iso_ms(now), "attempt": call.attempts},
                    now,
                    causation_id=correlation_id,
                )
            ]
        )
    return call
