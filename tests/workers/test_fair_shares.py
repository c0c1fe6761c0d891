"""A tenant whose targets are slow never holds every thread of a worker's pool: another tenant's
call due meanwhile starts on time (docs/flow-control.md, "Fair shares")."""

from __future__ import annotations

import time

import pytest

from core.fairness import round_robin
from orchestration.models import ServiceCall
from tests.support.factories import make_call
from tests.support.waiting import wait_for
from workers.shares import FairShares


def test_one_tenant_takes_at_most_its_share_and_leaves_the_reserve_to_the_others():
    shares = FairShares(size=48, per_tenant=36)
    assert (shares.reserve, shares.light) == (12, 3)
    assert shares.room_for("noisy", 48) == 36
    for _ in range(36):
        shares.take("noisy")
    assert shares.room_for("noisy", 12) == 0
    assert shares.full(12) == ["noisy"]
    # A quiet tenant takes from the reserve, up to `light` threads.
    assert shares.room_for("quiet", 12) == 3


def test_a_second_noisy_tenant_cannot_empty_the_reserve():
    shares = FairShares(size=48, per_tenant=36)
    for _ in range(36):
        shares.take("a")
    assert shares.room_for("c", 12) == 3
    for _ in range(3):
        shares.take("c")
    assert shares.room_for("c", 9) == 0
    assert shares.room_for("quiet", 9) == 3


def test_a_thread_given_back_says_whether_its_tenant_was_at_its_cap():
    shares = FairShares(size=4, per_tenant=3)
    for _ in range(3):
        shares.take("a")
    assert shares.give_back("a") is True
    assert shares.give_back("a") is False
    assert shares.held["a"] == 1
    shares.give_back("a")
    assert "a" not in shares.held


def test_a_pool_as_large_as_the_share_keeps_no_reserve():
    shares = FairShares(size=2, per_tenant=5)
    assert (shares.per_tenant, shares.reserve) == (2, 0)
    assert shares.room_for("a", 2) == 2


def test_the_tenants_take_turns_in_due_order_within_each():
    items = [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("a", 4), ("c", 1), ("b", 2)]
    assert round_robin(items, key=lambda item: item[0]) == [
        ("a", 1),
        ("b", 1),
        ("c", 1),
        ("a", 2),
        ("b", 2),
        ("a", 3),
        ("a", 4),
    ]


@pytest.fixture
def small_engine(transactional_db, settings):
    """The real engine in this process, with a pool of 8 threads of which one tenant holds 6."""
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    settings.EXECUTION_CONCURRENCY = 8
    settings.EXECUTION_PER_TENANT = 6
    keeper = SessionKeeper()
    running = Engine(keeper)
    running.start()
    yield running
    running.stop(drain_seconds=1)
    keeper.close()


def _lateness_ms(call) -> float:
    fresh = ServiceCall.objects.get(pk=call.pk)
    return (fresh.started_at - fresh.due_at).total_seconds() * 1000


@pytest.mark.serial  # a lateness under 200 ms
def test_a_call_due_while_another_tenant_fills_the_pool_with_slow_calls_starts_on_time(
    world, http_target, small_engine
):
    noisy = [make_call("globex", name=f"slow {n}", url=http_target.url("/delay/4000"), due_in=0.3) for n in range(20)]
    # Its first six run; the others wait, due, for a thread of its share.
    wait_for(lambda: http_target.count("/delay") == 6, timeout=5)
    quiet = make_call("acme", name="quiet", url=http_target.url("/ok"), due_in=0.5)
    wait_for(lambda: ServiceCall.objects.get(pk=quiet.pk).status == ServiceCall.Status.SUCCEEDED, timeout=3)
    assert _lateness_ms(quiet) < 200  # not behind the noisy tenant's 4 s answers
    assert max(r["concurrent"] for r in http_target.requests if r["path"].startswith("/delay")) <= 6
    assert small_engine.shares.held["globex"] <= 6
    # The noisy tenant's calls are only held back, never dropped.
    assert ServiceCall.objects.filter(pk__in=[c.pk for c in noisy], status=ServiceCall.Status.SCHEDULED).count() > 0


@pytest.mark.serial  # a start within 1.5 s
def test_the_backlog_starts_a_quiet_tenants_due_call_ahead_of_a_noisy_tenants_older_backlog(
    world, http_target, small_engine
):
    for n in range(30):
        make_call("globex", name=f"slow {n}", url=http_target.url("/delay/2000"))
    wait_for(lambda: http_target.count("/delay") == 6, timeout=5)
    started = time.monotonic()
    quiet = [make_call("acme", name=f"quiet {n}", url=http_target.url("/ok")) for n in range(3)]
    wait_for(
        lambda: (
            ServiceCall.objects.filter(pk__in=[c.pk for c in quiet], status=ServiceCall.Status.SUCCEEDED).count() == 3
        ),
        timeout=3,
    )
    assert time.monotonic() - started < 1.5  # not behind 24 of the noisy tenant's 2 s calls
    assert small_engine.shares.held.get("acme", 0) == 0
