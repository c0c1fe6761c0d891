"""What a subscription kind is: a channel, whole in one module (docs/architecture.md, "Adding a
channel"). The edges, the services and the delivery loop ask the kind's channel
(delivery.channels.channel_for) and never branch on a kind themselves.

A channel module is imported with the models (their kinds come from the registry): it loads its
transport (aiohttp, nats-py) on its first try, so that a web process never does."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from django import forms
from django.db.models import CheckConstraint

from core.ids import utcnow
from delivery.tries import ClaimedNotification, SendResult, failed_result

if TYPE_CHECKING:
    from delivery.models import Subscription
    from delivery.validation import SubscriptionInput

logger = logging.getLogger("serviceagent.delivery")

# validation's way of reporting a mistake: error(wire field, message); every one is reported.
ErrorSink = Callable[[str, str], None]


@dataclass(frozen=True)
class ChannelField:
    """One of a channel's own fields: what only subscriptions of its kind have."""

    wire: str  # its name in the API, validation's errors and the commands ("url")
    column: str  # the Subscription column and the SubscriptionInput attribute holding it ("url")
    only: str  # the refusal when an update gives it to another kind's subscription
    # The admin form's field for it (a new one each time: a form field is not shared).
    admin_field: Callable[[], forms.Field] = field(default=lambda: forms.CharField(required=False))


@dataclass(frozen=True)
class NewSubscription:
    """What a new subscription of a kind stores besides the common fields, and what is shown once
    to whoever made it (a webhook's signing secret)."""

    columns: Mapping[str, Any] = field(default_factory=dict)
    shown_once: str | None = None


class Tries(Protocol):
    """The delivery loop's side of a channel's tries (delivery.runner.Deliverer)."""

    def try_ended(self, batch: list[ClaimedNotification], results: list[SendResult]) -> None:
        """A try that ended without going out (it could not start): counted in `start`'s return."""

    def try_back(self, batch: list[ClaimedNotification], results: list[SendResult]) -> None:
        """A try that went out came back (any thread): recorded, and the next tries started."""

    def send_threads(self) -> Executor:
        """The loop's threads for channels whose tries block (`Channel.send`)."""


class Channel:
    """A subscription kind. Subclasses set the attributes and override what their kind does."""

    kind: str  # the stored value (Subscription.kind)
    label: str  # its name on pages and in the admin
    # Only an operator (the admin, operator-wide subscriptions) may make one; tenants may not.
    operator_only: bool = False
    fields: tuple[ChannelField, ...] = ()
    # A claim's notifications of this kind are tried as one batch (a publish of many), rather
    # than one try each.
    batched: bool = False
    # It signs what it sends with a secret of its own (rotated by subscription_rotate_secret).
    signs: bool = False
    # What its target is called ("URL or subject" in the admin's list).
    target_label: str = "target"
    # The subscriptions table's checks of its fields (Subscription.Meta.constraints).
    constraints: tuple[CheckConstraint, ...] = ()

    # --- Its subscriptions ------------------------------------------------------------------

    def validate(self, data: Mapping[str, Any], *, kind: Any, partial: bool, error: ErrorSink) -> dict[str, Any]:
        """Its own fields of `data` (a create's or an update's wire input, whatever its kind:
        `kind` is the one asked for, None on an update), each mistake passed to `error`; the
        values given, by column, for SubscriptionInput."""
        return {}

    def create(self, data: SubscriptionInput) -> NewSubscription:
        """What a new subscription of this kind stores besides `data` (delivery.services.
        subscription_create)."""
        return NewSubscription()

    def new_secret(self) -> str:
        """A new signing secret (channels that sign only)."""
        raise NotImplementedError(f"{self.kind} subscriptions have no signing secret")

    def target(self, subscription: Subscription) -> str:
        """Where it delivers, as the admin's list shows it."""
        return ""

    def admin_data(self, cleaned: Mapping[str, Any], *, kind: Any, adding: bool) -> dict[str, Any]:
        """Its fields from the admin form's cleaned data, in validation's wire shape."""
        return {}

    # --- Its tries ----------------------------------------------------------------------------

    def send(self, batch: list[ClaimedNotification]) -> list[SendResult]:
        """Try each of `batch` once and wait: one result each, in order."""
        raise NotImplementedError

    def start(self, batches: list[list[ClaimedNotification]], tries: Tries) -> int:
        """Start these tries (each a batch of this kind's claimed notifications: one notification,
        or a claim's whole batch for a `batched` channel) without waiting for them; each comes
        back through `tries`. Returns how many ended at once. By default each batch is `send` on
        one of the loop's threads; a channel with a transport of its own overrides it."""
        ended = 0
        for batch in batches:
            started = utcnow()
            try:
                tries.send_threads().submit(self._send_on_thread, batch, tries)
            except Exception as exc:  # a bug, or the pool gone: a failed try, never a lost one
                logger.exception("starting %d delivery tries failed", len(batch))
                tries.try_ended(batch, [failed_result(started, exc)] * len(batch))
                ended += 1
        return ended

    def _send_on_thread(self, batch: list[ClaimedNotification], tries: Tries) -> None:
        """`send` on a thread of the loop's, its results handed back; never raises."""
        started = utcnow()
        try:
            results = self.send(batch)
        except Exception as exc:
            logger.exception("trying %d deliveries failed", len(batch))
            results = [failed_result(started, exc) for _ in batch]
        tries.try_back(batch, results)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind!r}>"
