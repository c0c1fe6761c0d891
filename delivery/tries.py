"""What one delivery try reads and gives: a claimed notification and its result. Apart from the
services and the models, so that the channels (delivery/channels/), which the models' kinds come
from, can send without importing them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from delivery.models import Subscription


@dataclass(slots=True)
class ClaimedNotification:
    """A claimed notification as a try and its recording read it: a plain row, not a model
    instance (the delivery loop claims thousands a second during a burst, and building each
    through the ORM cost more than the database's work)."""

    pk: uuid.UUID
    subscription: Subscription  # loaded once per claim for all its notifications
    envelope: dict[str, Any]
    body: str  # event_body(envelope): made once per event, not once per subscription or try
    attempts: int
    step: int
    manual: bool
    event_created_at: datetime
    lease_until: datetime  # no other loop claims it before; a try must be over by then
    claimed_by: str = ""  # the worker session whose claim it is ("": none; NULL in the row)

    @property
    def subscription_id(self) -> uuid.UUID:
        return self.subscription.subscription_id


@dataclass(frozen=True)
class SendResult:
    """What one try gave: success, or an error (with a status for an HTTP answer)."""

    succeeded: bool
    started_at: datetime
    latency_ms: int | None = None
    status_code: int | None = None
    response_snippet: str = ""
    error: str = ""
    # Seconds a 429/503 answer asked us to wait (Retry-After), if it said.
    retry_after: float | None = None
    # The receiver said it is gone for good (410): the subscription is disabled.
    gone: bool = False
    # The egress policy refused the receiver's address: as a call's EgressDenied, never tried
    # again (the next try would be refused the same way); it expires at once and its
    # subscription is disabled with the reason (docs/events.md, "Retries").
    refused: bool = False


def failed_result(started: datetime, exc: BaseException, *, latency_ms: int | None = None) -> SendResult:
    """A try that raised: a failed result with the error's type and message, never a lost try."""
    return SendResult(succeeded=False, started_at=started, latency_ms=latency_ms, error=error_text(exc))


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]
