"""What a delivery loop holds, by subscription and by tenant (its claims, its tries out), and
the claimed tries waiting for a thread, in claim order (delivery.runner.Deliverer; docs/events.md,
"Fair shares")."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from core.fairness import ShareRule
from delivery.tries import ClaimedNotification

Place = tuple[uuid.UUID, "str | None"]  # a subscription, and its tenant (None: operator-wide)


def place(notification: ClaimedNotification) -> Place:
    return notification.subscription_id, notification.subscription.tenant_id


def places(batch: list[ClaimedNotification]) -> set[Place]:
    """A batch's subscriptions, each once (a NATS batch counts once for each of them)."""
    return {place(n) for n in batch}


class Held:
    """What each subscription holds (claims, or tries out), and each tenant's subscriptions
    together; operator-wide subscriptions belong to no tenant's share."""

    def __init__(self) -> None:
        self.by_subscription: Counter[uuid.UUID] = Counter()
        self.by_tenant: Counter[str] = Counter()

    def copy(self) -> Held:
        held = Held()
        held.by_subscription, held.by_tenant = Counter(self.by_subscription), Counter(self.by_tenant)
        return held

    def add(self, places: Iterable[Place]) -> None:
        for subscription_id, tenant_id in places:
            self.by_subscription[subscription_id] += 1
            if tenant_id is not None:
                self.by_tenant[tenant_id] += 1

    def remove(self, places: Iterable[Place]) -> None:
        for subscription_id, tenant_id in places:
            _decrement(self.by_subscription, subscription_id)
            if tenant_id is not None:
                _decrement(self.by_tenant, tenant_id)

    def at_cap(self, place: Place, *, per_subscription: int | None, tenant_share: ShareRule | None, free: int) -> bool:
        """Whether `place` may take none of `free` places now: its subscription holds its cap, or
        its tenant's subscriptions hold their share (core.fairness.ShareRule: a cap, and a
        reserve for the tenants holding few)."""
        subscription_id, tenant_id = place
        if per_subscription is not None and self.by_subscription[subscription_id] >= per_subscription:
            return True
        return (
            tenant_id is not None
            and tenant_share is not None
            and tenant_share.room_for(self.by_tenant[tenant_id], free) <= 0
        )


def _decrement(counter: Counter, key: Any) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


class Waiting:
    """The claimed tries not started yet, a queue per subscription (a NATS batch's under its
    subscriptions together), each entry numbered in claim order. Taking the next try looks at
    each queue's head, not at every waiting try: during a burst most of them wait for their
    subscription's share, and a try that came back looked past all of them to start the next
    (bench/HISTORY.md, 'Before and after: cheaper tries')."""

    def __init__(self) -> None:
        self._queues: dict[tuple[uuid.UUID, ...], deque[tuple[int, list[ClaimedNotification]]]] = {}
        self._numbers = itertools.count()
        self._count = 0

    def add(self, batch: list[ClaimedNotification]) -> None:
        key = tuple(sorted({n.subscription_id for n in batch}))
        self._queues.setdefault(key, deque()).append((next(self._numbers), batch))
        self._count += 1

    def take_first(
        self,
        has_room: Callable[[tuple[uuid.UUID, ...]], bool],
        *,
        stale: Callable[[list[ClaimedNotification]], bool],
        drop: Callable[[list[ClaimedNotification]], None],
    ) -> list[ClaimedNotification] | None:
        """The earliest claimed head among the queues with room, taken; stale heads met on the
        way, and the taken one's stale successors, are dropped (a stale try behind a good one
        keeps its room until it heads its queue: within a queue the leases end in claim order,
        so that is rare)."""
        first: tuple[int, tuple[uuid.UUID, ...]] | None = None
        for key in list(self._queues):
            entries = self._drop_stale_heads(key, stale, drop)
            if entries and (first is None or entries[0][0] < first[0]) and has_room(key):
                first = (entries[0][0], key)
        if first is None:
            return None
        _, batch = self._queues[first[1]].popleft()
        self._count -= 1
        self._drop_stale_heads(first[1], stale, drop)  # the next head, should it be stale, goes now
        return batch

    def _drop_stale_heads(
        self,
        key: tuple[uuid.UUID, ...],
        stale: Callable[[list[ClaimedNotification]], bool],
        drop: Callable[[list[ClaimedNotification]], None],
    ) -> deque[tuple[int, list[ClaimedNotification]]] | None:
        """Queue `key` without its stale heads; None (and the queue gone) once it is empty."""
        entries = self._queues[key]
        while entries and stale(entries[0][1]):
            drop(entries.popleft()[1])
            self._count -= 1
        if not entries:
            del self._queues[key]
            return None
        return entries

    def clear(self) -> list[list[ClaimedNotification]]:
        """Every waiting try, in claim order, taken."""
        batches = list(self)
        self._queues.clear()
        self._count = 0
        return batches

    def __iter__(self) -> Iterator[list[ClaimedNotification]]:
        entries = sorted(entry for queue in self._queues.values() for entry in queue)  # numbers are unique
        return iter([batch for _, batch in entries])

    def __len__(self) -> int:
        return self._count
