"""The delivery loop's waiting tries (delivery/shares.py `Waiting`): claimed and not started,
a queue per subscription, started in claim order as their subscriptions have room; a try that
can no longer finish within its lease, or was claimed under a session found dead, is dropped."""

from __future__ import annotations

import uuid
from datetime import timedelta
from types import SimpleNamespace

from core.ids import utcnow
from delivery.shares import Waiting

A, B, C = (uuid.UUID(int=n) for n in (1, 2, 3))
NOW = utcnow()


def claimed(subscription: uuid.UUID, name: str, *, lease_s: float = 60, session: str = "s1") -> SimpleNamespace:
    return SimpleNamespace(
        subscription_id=subscription, name=name, lease_until=NOW + timedelta(seconds=lease_s), claimed_by=session
    )


def names(batch) -> list[str]:
    return [n.name for n in batch]


def take(waiting: Waiting, *, room: set, dropped: list | None = None):
    batch = waiting.take_first(
        lambda subscriptions: set(subscriptions) <= room,
        stale=lambda batch: any(n.lease_until <= NOW or n.claimed_by != "s1" for n in batch),
        drop=(dropped if dropped is not None else []).append,
    )
    return None if batch is None else names(batch)


def test_the_earliest_claimed_try_among_the_subscriptions_with_room_starts_first():
    waiting = Waiting()
    for batch in ([claimed(A, "a1")], [claimed(B, "b1")], [claimed(A, "a2")], [claimed(B, "b2")]):
        waiting.add(batch)
    assert take(waiting, room={A, B}) == ["a1"]
    assert take(waiting, room={B}) == ["b1"]  # A is at its share: B's next goes, in claim order
    assert take(waiting, room={A, B}) == ["a2"]
    assert take(waiting, room=set()) is None  # nobody has room: nothing starts, nothing is lost
    assert len(waiting) == 1
    assert take(waiting, room={B}) == ["b2"]
    assert len(waiting) == 0 and not waiting


def test_a_nats_batch_of_several_subscriptions_waits_until_each_of_them_has_room():
    waiting = Waiting()
    waiting.add([claimed(B, "nats-b"), claimed(C, "nats-c")])
    waiting.add([claimed(A, "a1")])
    assert take(waiting, room={B, A}) == ["a1"]  # C has no room: the batch waits, the later try goes
    assert take(waiting, room={B, C}) == ["nats-b", "nats-c"]


def test_stale_tries_are_dropped_as_they_reach_the_head_of_their_queue_and_never_started():
    waiting = Waiting()
    waiting.add([claimed(A, "a-expiring", lease_s=-1)])
    waiting.add([claimed(A, "a-good")])
    waiting.add([claimed(A, "a-dead-session", session="s0")])
    waiting.add([claimed(B, "b-good")])
    dropped: list = []
    assert take(waiting, room={A, B}, dropped=dropped) == ["a-good"]
    # The stale head went on the way, and the taken one's stale successor with it: neither holds
    # its room until another try of A comes back.
    assert [names(batch) for batch in dropped] == [["a-expiring"], ["a-dead-session"]]
    assert len(waiting) == 1
    assert take(waiting, room={A, B}, dropped=dropped) == ["b-good"]


def test_clear_gives_every_waiting_try_back_in_claim_order():
    waiting = Waiting()
    for batch in ([claimed(B, "b1")], [claimed(A, "a1")], [claimed(B, "b2")]):
        waiting.add(batch)
    assert [names(batch) for batch in list(waiting)] == [["b1"], ["a1"], ["b2"]]
    assert [names(batch) for batch in waiting.clear()] == [["b1"], ["a1"], ["b2"]]
    assert len(waiting) == 0 and list(waiting) == []
