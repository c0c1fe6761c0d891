"""The engine's write gate: one write transaction at a time among a process's threads, the
timer's start first, the outbox dispatcher next (every delivery waits for its fan-out) but at
every other slot at most while others wait, the rest in arrival order."""

from __future__ import annotations

import threading

from tests.support.waiting import wait_for
from workers.gate import WriteGate


class Writers:
    """Threads that each take one slot of `gate` and note their name when they have it."""

    def __init__(self, gate: WriteGate) -> None:
        self.gate = gate
        self.order: list[str] = []
        self.threads: list[threading.Thread] = []

    def start(self, name: str, **kind: bool) -> None:
        def write() -> None:
            with self.gate.slot(**kind):
                self.order.append(name)

        thread = threading.Thread(target=write)
        thread.start()
        self.threads.append(thread)

    def join(self) -> list[str]:
        for thread in self.threads:
            thread.join(5)
        return self.order


def waiting(gate: WriteGate, *, urgent: int = 0, early: int = 0, others: int = 0):
    return lambda: (gate._urgent, gate._early, gate._waiting) == (urgent, early, others)


def test_the_timer_goes_first_then_the_dispatcher_then_the_others_in_arrival_order():
    gate = WriteGate()
    writers = Writers(gate)
    with gate.slot():  # a transaction in progress
        writers.start("recorder")
        wait_for(waiting(gate, others=1))
        writers.start("delivery")
        wait_for(waiting(gate, others=2))
        writers.start("dispatcher", early=True)
        writers.start("timer", urgent=True)
        wait_for(waiting(gate, urgent=1, early=1, others=2))
    assert writers.join() == ["timer", "dispatcher", "recorder", "delivery"]


def test_a_dispatcher_with_a_backlog_takes_every_other_slot_while_others_wait():
    gate = WriteGate()
    writers = Writers(gate)
    with gate.slot():
        for name in ("recorder", "delivery", "backlog"):
            writers.start(name)
            wait_for(waiting(gate, others=len(writers.threads)))
        for n in (1, 2, 3):
            writers.start(f"dispatch {n}", early=True)
        wait_for(waiting(gate, early=3, others=3))
    order = [name.split()[0] for name in writers.join()]  # (the dispatchers among themselves: any order)
    assert order == ["dispatch", "recorder", "dispatch", "delivery", "dispatch", "backlog"]
