"""The outbox sink that fans published events out into notifications, one per (event ×
matching subscription), after the state change committed (docs/events.md)."""

from __future__ import annotations

from collections.abc import Sequence

from delivery.services import FanoutEvent, notifications_fan_out
from outbox.sinks import ClaimedEvent


class NotificationSink:
    name = "notifications"
    in_transaction = True  # it writes notification rows in this database

    def publish_events(self, events: Sequence[ClaimedEvent]) -> None:
        notifications_fan_out(
            events=[FanoutEvent(envelope=row.event_payload, seq=row.id, created_at=row.created_at) for row in events]
        )
