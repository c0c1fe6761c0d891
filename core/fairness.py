"""Fair shares among tenants (docs/flow-control.md, "Fair shares"): how much of a pool a tenant
may take (ShareRule), and round robin by tenant among the work waiting."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def round_robin(items: Sequence[T], key: Callable[[T], Hashable]) -> list[T]:
    """`items` (in due order) interleaved by `key` (the tenant): each tenant's first, then each
    one's second, and so on, the tenants in the order of their first item; due order is kept
    within a tenant."""
    queues: dict[Hashable, list[T]] = {}
    for item in items:
        queues.setdefault(key(item), []).append(item)
    ordered: list[T] = []
    depth = 0
    while len(ordered) < len(items):
        ordered.extend(queue[depth] for queue in queues.values() if depth < len(queue))
        depth += 1
    return ordered


@dataclass(frozen=True)
class ShareRule:
    """How many of a pool's free places a tenant may take, given what it holds (the engine's
    execution threads, a worker's delivery tries and claims: docs/flow-control.md, "Fair
    shares").

    - No tenant holds more than `per_tenant` of the `size` places; the rest, the **reserve**, is
      always left to the others.
    - A tenant takes places of the reserve only while it holds fewer than `light` (a quarter of
      the reserve): with several noisy tenants the reserve still has room for the quiet ones.
    """

    size: int
    per_tenant: int

    @classmethod
    def of(cls, *, size: int, per_tenant: int) -> ShareRule:
        return cls(size=size, per_tenant=max(1, min(per_tenant, size)))

    @property
    def reserve(self) -> int:
        return self.size - self.per_tenant

    @property
    def light(self) -> int:
        return max(1, self.reserve // 4) if self.reserve else 0

    def room_for(self, held: int, free: int) -> int:
        """How many of `free` places a tenant holding `held` may take now."""
        beyond_reserve = max(0, free - self.reserve)
        return max(0, min(self.per_tenant - held, free, beyond_reserve + max(0, self.light - held)))
