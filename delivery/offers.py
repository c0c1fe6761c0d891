"""The fan-out's hand-over to a delivery loop: the loop offers its room, the fan-out makes the
heads of new queues claimed for it, and they start without waiting for the loop's next claim
(delivery.services.notifications_fan_out; docs/events.md, "Handed over at the fan-out")."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from core.db.wakeups import Channel, wakeups
from core.fairness import ShareRule
from delivery.shares import Held, Waiting, place
from delivery.tries import ClaimedNotification

if TYPE_CHECKING:
    from delivery.models import Subscription
    from delivery.services import ClaimOffer


class HandOver:
    """The Deliverer's side of the hand-over (delivery.runner.Deliverer holds the state)."""

    # The Deliverer's, under its lock: see delivery.runner.Deliverer.
    _lock: threading.Lock
    _offers: list[Offer]
    _claimed: Held
    _waiting: Waiting
    _stopping: bool
    in_flight: int
    claim_ahead: int
    concurrency: int
    _claim_cap: int | None
    _tenant_claim_share: ShareRule | None
    session: Callable[[], str | None]

    def _wait_for_start(self, claimed: list[ClaimedNotification]) -> None:
        raise NotImplementedError

    def _give_back_waiting(self) -> None:
        raise NotImplementedError

    def _start_tries(self) -> None:
        raise NotImplementedError

    def offer(self) -> ClaimOffer | None:
        """Room for the notifications a fan-out in this process makes (delivery.services
        .notifications_fan_out): the heads it reserves are made claimed for this loop's session
        and taken when the fan-out commits; `offers_done` gives back what was not taken and
        starts the taken. None while the session is unsure, the loop stopping, or its room all
        taken (during a burst, most of the time): the fan-out then looks for no heads at all."""
        session = self.session()
        if session is None or self._stopping:
            return None
        offer = Offer(self, session)
        with self._lock:
            if self.in_flight >= self.claim_ahead * self.concurrency:
                return None
            self._offers.append(offer)
        return offer

    def _reserve(self, offer: Offer, subscription: Subscription) -> bool:
        place = (subscription.subscription_id, subscription.tenant_id)
        with self._lock:
            if self._stopping or offer.settled or self.in_flight >= self.claim_ahead * self.concurrency:
                return False
            free = self.claim_ahead * self.concurrency - self.in_flight
            if self._claimed.at_cap(
                place, per_subscription=self._claim_cap, tenant_share=self._tenant_claim_share, free=free
            ):
                return False
            self.in_flight += 1
            self._claimed.add([place])
            offer.reserved[place] += 1
            return True

    def _take(self, offer: Offer, claimed: list[ClaimedNotification]) -> None:
        """On the fan-out's commit: its reserved room now holds these claims (or, should the
        commit come after offers_done gave the room back, they are counted again). A loop that
        stopped meanwhile gives them back at the next offers_done or, the engine's dispatch
        having ended, leaves them to the watchdog once its session ends, as any claim."""
        with self._lock:
            if offer.settled:
                self.in_flight += len(claimed)
                self._claimed.add(place(n) for n in claimed)
            else:
                offer.reserved.subtract(place(n) for n in claimed)
            self._wait_for_start(claimed)

    def offers_done(self) -> None:
        """After the dispatch that asked for offers (committed or not): the room reserved and not
        taken is given back, and the taken tries start (or, should the loop be stopping, are given
        back untried)."""
        with self._lock:
            for offer in self._offers:
                offer.settled = True
                left = +offer.reserved
                self.in_flight -= left.total()
                self._claimed.remove(left.elements())
            self._offers.clear()
        if self._stopping:
            self._give_back_waiting()
        elif self._waiting:
            self._start_tries()
            wakeups.wake_here(Channel.DELIVERY)  # the delivery loop records them as they come back


class Offer:
    """One fan-out's room in a Deliverer (Deliverer.offer; delivery.services.ClaimOffer)."""

    def __init__(self, deliverer: HandOver, session: str) -> None:
        self.deliverer = deliverer
        self.session = session
        # Held and not yet taken, by (subscription, its tenant).
        self.reserved: Counter[tuple[uuid.UUID, str | None]] = Counter()
        self.settled = False  # offers_done gave back what was not taken

    def reserve(self, subscription: Subscription) -> bool:
        return self.deliverer._reserve(self, subscription)

    def take(self, claimed: list[ClaimedNotification]) -> None:
        self.deliverer._take(self, claimed)
