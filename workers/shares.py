"""Fair shares of a worker process's execution pool among tenants (docs/flow-control.md, "Fair
shares").

An attempt holds its thread as long as its target takes to answer, so a share must count what a
tenant has in flight, not only what it has waiting: a tenant whose targets answer after 20 s
would otherwise fill every thread, and another tenant's call due meanwhile would start 20 s late.
The rule (core.fairness.ShareRule): no tenant holds more than `per_tenant` threads; the rest, the
reserve, goes to tenants holding few. Free threads go to the waiting tenants in turn (round
robin), then in due order within one.

Pure bookkeeping: the engine calls it under its own lock.
"""

from __future__ import annotations

from collections import Counter

from core.fairness import ShareRule


class FairShares:
    def __init__(self, *, size: int, per_tenant: int) -> None:
        self.rule = ShareRule.of(size=size, per_tenant=per_tenant)
        # Threads each tenant holds: attempts running, and starts admitted but not yet handed
        # to the pool.
        self.held: Counter[str] = Counter()

    @property
    def per_tenant(self) -> int:
        return self.rule.per_tenant

    @property
    def reserve(self) -> int:
        return self.rule.reserve

    @property
    def light(self) -> int:
        return self.rule.light

    def room_for(self, tenant_id: str, free: int) -> int:
        """How many of `free` threads `tenant_id` may take now."""
        return self.rule.room_for(self.held[tenant_id], free)

    def full(self, free: int) -> list[str]:
        """The tenants that may take none of `free` threads now (only tenants holding some can
        be): the backlog looks past their due calls."""
        return sorted(tenant for tenant in self.held if self.held[tenant] and not self.room_for(tenant, free))

    def take(self, tenant_id: str) -> None:
        self.held[tenant_id] += 1

    def give_back(self, tenant_id: str, count: int = 1) -> bool:
        """`count` threads of `tenant_id` are free again; whether it was at its cap before."""
        was_full = self.held[tenant_id] >= self.per_tenant
        self.held[tenant_id] -= count
        if self.held[tenant_id] <= 0:
            del self.held[tenant_id]
        return was_full
