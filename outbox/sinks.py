"""Where published events go. The log sink is always on; others are added by settings."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

from django.conf import settings
from django.utils.module_loading import import_string

event_log = logging.getLogger("serviceagent.events")


@dataclass(frozen=True, slots=True)
class ClaimedEvent:
    """An outbox row as the dispatcher claims it (outbox/dispatcher.py): the columns the sinks
    and the dispatcher read, without a model instance built per row."""

    id: int
    event_id: uuid.UUID
    tenant_id: str
    aggregate_id: uuid.UUID
    event_type: str
    event_payload: dict[str, Any]  # the envelope (docs/schema.md, 'The event envelope')
    created_at: datetime
    attempts: int

    @property
    def pk(self) -> int:
        return self.id


class Sink(Protocol):
    name: str
    # True for a sink that may publish inside the dispatcher's transaction: it writes only this
    # database, or only logs (a rolled-back batch is published again: at least once). When every
    # configured sink says so, a batch is claimed, published and marked in one transaction
    # (outbox/dispatcher.py; docs/architecture.md, "The path of one call", its step 7).
    in_transaction: bool

    def publish(self, envelopes: Sequence[dict[str, Any]]) -> None:
        """Publish in order; raise to have the rest of the batch retried later."""


@runtime_checkable
class BatchSink(Protocol):
    """A sink that takes a dispatcher's whole batch of rows at once (in one write)."""

    name: str
    in_transaction: bool

    def publish_events(self, events: Sequence[ClaimedEvent]) -> None:
        """Raise to have the whole batch retried later; must be idempotent."""


class LogSink:
    name = "log"
    in_transaction = True

    def publish(self, envelopes: Sequence[dict[str, Any]]) -> None:
        if not event_log.isEnabledFor(logging.INFO):
            return  # EVENT_LOG_LEVEL above INFO (the default): nobody reads these lines
        for envelope in envelopes:
            # The type as the message and the envelope as a nested field (an object in a JSON
            # line; left out of a text line), never JSON encoded inside the line's JSON.
            event_log.info(
                envelope["type"],
                extra={
                    "tenantId": envelope["tenantId"],
                    "serviceCallId": envelope["aggregateId"],
                    "correlationId": envelope["correlationId"],
                    "eventType": envelope["type"],
                    "eventId": envelope["id"],
                    "event": envelope,
                },
            )


@lru_cache(maxsize=1)
def configured_sinks() -> tuple[Sink, ...]:
    return tuple(import_string(path)() for path in settings.OUTBOX_SINKS)
