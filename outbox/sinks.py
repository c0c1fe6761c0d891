"""Where published events go. The log sink is always on; others are added by settings."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

event_log = logging.getLogger("serviceagent.events")


class Sink(Protocol):
    name: str

    def publish(self, envelopes: Sequence[dict[str, Any]]) -> None:
        """Publish in order; raise to have the rest of the batch retried later."""


class LogSink:
    name = "log"

    def publish(self, envelopes: Sequence[dict[str, Any]]) -> None:
        if not event_log.isEnabledFor(logging.INFO):
            return  # EVENT_LOG_LEVEL above INFO: skip the JSON encoding nobody reads
        for envelope in envelopes:
            event_log.info(
                json.dumps(envelope, separators=(",", ":")),
                extra={
                    "tenantId": envelope["tenantId"],
                    "serviceCallId": envelope["aggregateId"],
                    "correlationId": envelope["correlationId"],
                    "eventType": envelope["type"],
                },
            )


@lru_cache(maxsize=1)
def configured_sinks() -> tuple[Sink, ...]:
    return tuple(import_string(path)() for path in settings.OUTBOX_SINKS)
