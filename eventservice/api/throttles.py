"""The request ceilings of the API (docs/flow-control.md, "Operator ceilings"): DRF throttles
whose rate is the tenant's ceiling, counted in the shared `limits` cache (the database, or Redis
with CACHE_URL) so that they hold across web processes and hosts. Over a ceiling the API answers
429 problem+json with `Retry-After` (eventservice.api.errors).

Each counts one caller as one tenant: a submission is counted per API key (per login for a
browser session) and tenant, a test ping per tenant. They run once the caller is known to act
for the tenant (eventservice.api.base.TenantApiView), so a stranger is refused with 404 before
any count, and never sees another tenant's ceiling. A resend of a delivery counts with the test
pings (it sends to the tenant's address as one does), and the dashboard's forms count with the
API (`page_over_ceiling`).

DRF's count is a sliding window kept as a list of times, read and then written back. Within a
process the threads take turns at it; two web processes answering one key at the same moment
can each write their own list over the other's, so under a parallel flood a ceiling holds per
web process: at most that many times it in all (with gunicorn's default two, twice).
"""

from __future__ import annotations

import math
import threading
from typing import Any

from django.core.cache import caches
from django.db import connection
from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from tenants.authentication import ApiKeyPrincipal
from tenants.selectors import tenant_ceilings_get

_COUNTING = threading.Lock()


class CeilingThrottle(SimpleRateThrottle):
    """A throttle whose rate is one of the tenant's ceilings, for the methods named."""

    methods: frozenset[str] = frozenset({"POST"})
    # The window of the ceiling, in seconds.
    window: int = 1

    def __init__(self) -> None:  # no THROTTLE_RATES lookup: the rate is the tenant's
        self.rate = None

    @property
    def cache(self) -> Any:  # type: ignore[override]
        return caches["limits"]

    # What the ceiling counts, for the 429's detail: "{n} submissions a second per API key".
    counted: str = ""

    def ceiling(self, tenant_id: str) -> int:
        raise NotImplementedError

    def throttle_failure(self) -> bool:
        # DRF adds "Expected available in N seconds." (and the 429's Retry-After) to the detail.
        raise Throttled(
            wait=max(1, math.ceil(self.wait() or 1)),
            detail=f"At most {self.counted.format(n=self.num_requests)} for this tenant (the operator's ceiling).",
        )

    def who(self, request: Request) -> str:
        return "tenant"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return f"ceiling:{self.scope}:{view.tenant_id}:{self.who(request)}"

    def throttle_success(self) -> bool:
        # The times are kept a minute at least (the window drops the old ones itself): a key that
        # expired with a one-second window would read as no history to a request a moment late.
        self.history.insert(0, self.now)
        self.cache.set(self.key, self.history, max(self.duration, 60))
        return True

    def allow_request(self, request: Request, view: Any) -> bool:
        if request.method not in self.methods:
            return True
        self.num_requests, self.duration = self.ceiling(view.tenant_id), self.window
        self.rate = f"{self.num_requests}/{self.window}s"
        # DRF reads the times, then writes them back: one at a time in this process, so its
        # threads never write over each other's counts (other processes still may: see above).
        # The connection before the lock (the counts are in the database unless CACHE_URL is
        # Redis): the lock's holder never waits for the pool, whose connections the threads
        # waiting for the lock may hold (core/db/pool.py).
        connection.ensure_connection()
        with _COUNTING:
            return super().allow_request(request, view)


class CountedThrottle(CeilingThrottle):
    """A ceiling throttle that charges a request `count` submissions (a batch's calls, a bulk
    rerun's): it is let in while the key is under its ceiling, as one submission is, and its
    charge is spread over the window's future at the ceiling's pace (the n-th at now + n / rate),
    so what follows waits until the charge has been paid: count / ceiling windows."""

    count: int = 1

    def throttle_success(self) -> bool:
        step = self.duration / max(1, self.num_requests)
        charge = [self.now + step * n for n in range(self.count - 1, 0, -1)]
        self.history[:0] = charge
        self.history.insert(len(charge), self.now)
        keep = max(self.duration, 60) + step * self.count
        self.cache.set(self.key, self.history, keep)
        return True


class SubmissionThrottle(CeilingThrottle):
    """POST .../service-calls and .../rerun: `submissionsPerSecond` per API key (per login)."""

    scope = "submissions"
    counted = "{n} submissions a second per API key"

    def ceiling(self, tenant_id: str) -> int:
        return tenant_ceilings_get(tenant_id=tenant_id).submissions_per_second

    def who(self, request: Request) -> str:
        user = request.user
        return user.pk if isinstance(user, ApiKeyPrincipal) else f"user:{user.pk}"


class CountedSubmissionThrottle(CountedThrottle, SubmissionThrottle):
    """Submissions counted by the call: a batch's, a bulk rerun's."""


def submissions_charge(request: Request, view: Any, count: int) -> None:
    """Charge `count` submissions to the caller's key (a bulk rerun's new calls), or raise
    Throttled (429 with Retry-After) while it is over its ceiling."""
    throttle = CountedSubmissionThrottle()
    throttle.count = max(1, count)
    throttle.allow_request(request, view)


class PingThrottle(CeilingThrottle):
    """POST .../subscriptions/{id}/test: `testPingsPerMinute` per tenant."""

    scope = "test-pings"
    window = 60
    counted = "{n} test pings a minute"

    def ceiling(self, tenant_id: str) -> int:
        return tenant_ceilings_get(tenant_id=tenant_id).test_pings_per_minute


class _Tenant:
    """What a ceiling throttle reads of its view: the tenant acted for."""

    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id


def page_over_ceiling(
    throttle: type[CeilingThrottle], request: Any, tenant_id: str, *, count: int | None = None
) -> str | None:
    """For the dashboard's forms, which submit and ping as the API does: the same ceiling, counted
    in the same place (a login's submissions with its API calls), so a tenant cannot pass a
    ceiling by the pages; `count` charges that many at once (a counted throttle: a bulk rerun's
    new calls). The message to show when the request is over it, else None."""
    checking = throttle()
    if count is not None:
        checking.count = max(1, count)
    try:
        checking.allow_request(request, _Tenant(tenant_id))
    except Throttled as exc:
        return str(exc.detail)
    return None
