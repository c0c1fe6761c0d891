"""Timer registration and firing; the timer knows nothing of HTTP or of call state."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from django.db import transaction

from eventservice.ids import utcnow
from timer.models import TimerSchedule


def timer_register(
    *, tenant_id: str, service_call_id: uuid.UUID, due_at: datetime, correlation_id: str
) -> bool:
    """Idempotent upsert; a Reached timer is never re-armed. Returns True if armed."""
    with transaction.atomic():
        moved = TimerSchedule.objects.filter(
            tenant_id=tenant_id, service_call_id=service_call_id, state=TimerSchedule.State.SCHEDULED
        ).update(due_at=due_at, correlation_id=correlation_id)
        if moved:
            return True
        TimerSchedule.objects.bulk_create(
            [TimerSchedule(
                tenant_id=tenant_id, service_call_id=service_call_id, due_at=due_at,
                correlation_id=correlation_id, registered_at=utcnow(),
                state=TimerSchedule.State.SCHEDULED,
            )],
            ignore_conflicts=True,  # an existing row is Reached: leave it
        )
        return TimerSchedule.objects.filter(
            tenant_id=tenant_id, service_call_id=service_call_id, state=TimerSchedule.State.SCHEDULED
        ).exists()


def timers_mark_reached(*, ids: Sequence[int]) -> int:
    """Scheduled -> Reached; zero rows means another worker fired them first."""
    if not ids:
        return 0
    with transaction.atomic():
        return TimerSchedule.objects.filter(pk__in=list(ids), state=TimerSchedule.State.SCHEDULED).update(
            state=TimerSchedule.State.REACHED, reached_at=utcnow()
        )
