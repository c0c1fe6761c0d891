"""Round robin by tenant: how the engine shares its threads among the tenants that have work
waiting (docs/flow-control.md, "Fair shares")."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
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
