"""The outbox sink that fans published events out into notifications, one per (event ×
matching subscription), after the state change committed (docs/events.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.db import connection

from delivery.services import ClaimOffer, FanoutEvent, notifications_fan_out
from outbox.sinks import ClaimedEvent


class NotificationSink:
    name = "notifications"
    in_transaction = True  # it writes notification rows in this database

    def __init__(self, offer: Callable[[], ClaimOffer | None] | None = None) -> None:
        # Asked once per batch for a delivery loop's room (the engine passes its own loop's,
        # delivery.runner.Deliverer.offer): the heads it takes are made claimed for it.
        self.offer = offer

    def publish_events(self, events: Sequence[ClaimedEvent]) -> None:
        # Handed over only inside the dispatcher's one transaction, where the dispatchers of every
        # cluster take turns (outbox/dispatcher.py): on its leased path two dispatchers may fan out
        # events of one call at once, and each would take its own for the head of the queue.
        handing = self.offer is not None and connection.in_atomic_block
        notifications_fan_out(
            events=[FanoutEvent(envelope=row.event_payload, seq=row.id, created_at=row.created_at) for row in events],
            offer=self.offer() if handing else None,
        )
