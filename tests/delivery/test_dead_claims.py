"""A worker found dead has its claimed deliveries given back, due once any try of it is surely
over rather than at the end of their lease; a worker declared dead while it still runs starts
none of the tries it had claimed (docs/events.md, "The guarantees")."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection

from core.ids import utcnow
from delivery.models import Notification
from delivery.runner import Deliverer
from delivery.services import (
    SendResult,
    lease_length,
    longest_try_ms,
    notifications_claim,
    notifications_record,
    notifications_release,
    notifications_release_dead_claims,
    subscription_create,
    subscription_send_test,
)
from delivery.validation import SubscriptionInput
from tests.delivery.receivers import receiving
from tests.support.locks import row_locked_elsewhere
from tests.support.waiting import wait_for

# The claim differs on PostgreSQL (FOR UPDATE SKIP LOCKED); the release and the record's check
# are the same statements on both.
pytestmark = pytest.mark.also_postgres


def webhook(url: str):
    return subscription_create(tenant_id="acme", data=SubscriptionInput(kind="webhook", name="hook", url=url))[0]


def pings(subscription, n: int) -> None:
    for _ in range(n):  # each the head of its own queue
        subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)


def row(claimed) -> Notification:
    return Notification.objects.get(pk=claimed.pk)


def test_only_the_claims_of_sessions_dead_when_the_watchdog_looked_are_given_back(world):
    pings(webhook("http://127.0.0.1:9/hook"), 6)
    dead = notifications_claim(limit=2, claimed_by="dead")
    [alive] = notifications_claim(limit=1, claimed_by="alive")
    [outside] = notifications_claim(limit=1)  # deliver_now: no session, the lease only
    looked_at = utcnow()
    # A session started after the watchdog read the live ones: its claims are not judged.
    [newer] = notifications_claim(limit=1, claimed_by="newer", now=looked_at + timedelta(seconds=1))
    # A dead session's try recorded before it died is not reopened.
    notifications_record(results=[(dead[1], SendResult(succeeded=True, started_at=utcnow(), status_code=200))])

    released = notifications_release_dead_claims(live_sessions={"alive"}, looked_at=looked_at)

    assert released == 1
    given_back = row(dead[0])
    assert (given_back.locked_until, given_back.claimed_by) == (None, None)
    # Due once any try the dead session may have started is over: the longest try after the
    # look, long before the lease's end.
    surely_over = looked_at + timedelta(milliseconds=longest_try_ms())
    assert given_back.next_attempt_at == surely_over < dead[0].lease_until
    assert row(dead[1]).state == Notification.State.SUCCEEDED and row(dead[1]).next_attempt_at is None
    for kept, by in ((alive, "alive"), (outside, None), (newer, "newer")):
        assert (row(kept).locked_until, row(kept).claimed_by) == (kept.lease_until, by)
    # Not before: then for any loop, beside the one never claimed.
    assert dead[0].pk not in {n.pk for n in notifications_claim(limit=10, now=surely_over - timedelta(seconds=1))}
    again = notifications_claim(limit=10, claimed_by="alive", now=surely_over)
    assert dead[0].pk in {n.pk for n in again}
    assert row(dead[0]).claimed_by == "alive"


def test_a_claim_made_when_the_watchdog_looked_is_judged_one_made_after_is_not(world):
    pings(webhook("http://127.0.0.1:9/hook"), 2)
    looked_at = utcnow()
    [at_the_look] = notifications_claim(limit=1, claimed_by="gone", now=looked_at)
    [just_after] = notifications_claim(limit=1, claimed_by="gone", now=looked_at + timedelta(milliseconds=1))
    assert notifications_release_dead_claims(live_sessions=set(), looked_at=looked_at) == 1
    assert row(at_the_look).locked_until is None
    assert row(just_after).locked_until == looked_at + timedelta(milliseconds=1) + lease_length()


def test_tries_claimed_under_a_session_found_dead_since_are_never_started(transactional_db, world, settings):
    """The session changes (the keeper was told its old one was declared dead) while tries it
    claimed wait: the try out comes back and is recorded, the waiting ones are not sent; the
    watchdog's release makes them due, and the new session delivers them."""
    # Given back tries are due the longest try after the release: 3 s here.
    settings.WEBHOOK_TIMEOUT_MS, settings.NATS_PUBLISH_TIMEOUT_MS = 3_000, 500
    settings.DELIVERY_CLAIM_AHEAD = 4  # three claimed with one try out, whatever the database
    with receiving() as receiver:
        hook = webhook(receiver.url("/delay/1500"))
        pings(hook, 3)
        session = ["first"]
        deliverer = Deliverer(concurrency=1, batch_size=4, session=lambda: session[0])
        try:
            assert deliverer.step() == 3  # all three claimed, one try out
            # The receiver answers 1.5 s after the request arrives: the session changes while
            # the try is out, whatever the machine's load.
            wait_for(lambda: len(receiver.at("/delay/1500")) == 1, timeout=5)
            session[0] = "second"
            wait_for(lambda: deliverer.results.qsize() == 1, timeout=5)
            time.sleep(0.3)  # time enough for the next try, were it started
            assert len(receiver.at("/delay/1500")) == 1
            deliverer.record_ready()
            assert deliverer.idle()
            held = Notification.objects.filter(subscription=hook, claimed_by="first")
            assert held.count() == 2 and all(n.locked_until > utcnow() for n in held)

            assert notifications_release_dead_claims(live_sessions={"second"}, looked_at=utcnow()) == 2

            def delivered() -> bool:
                deliverer.step()
                return Notification.objects.filter(subscription=hook, state=Notification.State.SUCCEEDED).count() == 3

            wait_for(delivered, timeout=15)
            assert len(receiver.at("/delay/1500")) == 3  # each sent once
        finally:
            deliverer.stop(timeout=5)


def test_while_the_session_is_unsure_nothing_is_claimed_and_no_waiting_try_starts(transactional_db, world):
    """A late heartbeat (the session may be declared dead any moment): the loop claims nothing
    and starts none of its waiting tries until the heartbeat is back."""
    with receiving() as receiver:
        hook = webhook(receiver.url("/delay/1500"))
        pings(hook, 2)
        session: list[str | None] = [None]
        deliverer = Deliverer(concurrency=1, batch_size=4, session=lambda: session[0])
        try:
            assert deliverer.step() == 0
            assert not Notification.objects.filter(locked_until__isnull=False).exists()

            session[0] = "mine"
            assert deliverer.step() == 2  # both claimed, one try out
            wait_for(lambda: len(receiver.at("/delay/1500")) == 1, timeout=5)
            session[0] = None
            wait_for(lambda: deliverer.results.qsize() == 1, timeout=5)
            time.sleep(0.3)
            assert len(receiver.at("/delay/1500")) == 1  # the waiting one was not started
            deliverer.step()  # records the first; still claims nothing, starts nothing
            assert len(receiver.at("/delay/1500")) == 1

            session[0] = "mine"
            deliverer.step()
            wait_for(lambda: len(receiver.at("/delay/1500")) == 2, timeout=5)
        finally:
            deliverer.stop(timeout=5)


def test_the_keeper_vouches_for_its_session_only_while_its_heartbeat_is_recent(transactional_db, settings):
    from workers.keeper import SessionKeeper

    settings.WORKER_HEARTBEAT_SECONDS = 1
    keeper = SessionKeeper()
    try:
        assert keeper.surely_alive() == keeper.session_id
        # As if the last heartbeat had been written half the stale time ago (a stalled process).
        keeper._beaten_at = time.monotonic() - settings.WORKER_STALE_SECONDS / 2
        assert keeper.surely_alive() is None
        wait_for(lambda: keeper.surely_alive() is not None, timeout=5)  # the next heartbeat
        assert keeper.surely_alive() == keeper.session_id
    finally:
        keeper.close()


def test_a_try_that_comes_back_after_its_claim_was_given_back_is_not_recorded(world):
    """The notification is another loop's now, or due again: the late result would overwrite
    what that loop records."""
    pings(webhook("http://127.0.0.1:9/hook"), 2)
    tried = notifications_claim(limit=2, claimed_by="stalled")
    looked_at = utcnow()
    assert notifications_release_dead_claims(live_sessions=set(), looked_at=looked_at) == 2
    later = looked_at + timedelta(milliseconds=longest_try_ms())
    [again] = notifications_claim(limit=1, claimed_by="next", now=later)
    [left] = [n for n in tried if n.pk != again.pk]  # given back, not claimed since
    late = SendResult(succeeded=False, started_at=utcnow(), error="late")

    notifications_record(results=[(n, late) for n in tried])

    for given_back in tried:
        assert row(given_back).attempts == 0 and row(given_back).delivery_attempts.count() == 0
    assert (row(again).claimed_by, row(again).locked_until) == ("next", again.lease_until)
    assert (row(left).claimed_by, row(left).locked_until, row(left).state) == (None, None, Notification.State.PENDING)

    notifications_record(results=[(again, SendResult(succeeded=True, started_at=utcnow(), status_code=200))])
    assert (row(again).state, row(again).attempts) == (Notification.State.SUCCEEDED, 1)


def test_a_stopping_loop_gives_back_only_the_claims_it_still_holds(world):
    """A waiting try claimed under a session the watchdog found dead may be another loop's by
    the time the loop stops: that claim is left to the other loop."""
    pings(webhook("http://127.0.0.1:9/hook"), 2)
    old, mine = notifications_claim(limit=2, claimed_by="old")
    looked_at = utcnow()
    notifications_release_dead_claims(live_sessions=set(), looked_at=looked_at)
    later = looked_at + timedelta(milliseconds=longest_try_ms())
    [taken] = [n for n in notifications_claim(limit=2, claimed_by="other", now=later) if n.pk == old.pk]

    notifications_release(notifications=[old, mine])

    assert (row(old).claimed_by, row(old).locked_until) == ("other", taken.lease_until)
    assert row(mine).claimed_by == "other"  # the other loop took both; neither is given back


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: PostgreSQL (SQLite's writes take turns)")
def test_the_watchdog_leaves_a_claim_being_recorded_to_the_recording(transactional_db, world):
    """On PostgreSQL a recording locks its rows before it looks at who holds them: the
    watchdog's release skips a locked row (the next pass judges it), so it never gives back a
    claim between the recording's look and its writes."""
    pings(webhook("http://127.0.0.1:9/hook"), 1)
    [claimed] = notifications_claim(limit=1, claimed_by="dying")
    with row_locked_elsewhere(Notification, claimed.pk):
        assert notifications_release_dead_claims(live_sessions=set(), looked_at=utcnow()) == 0
    assert notifications_release_dead_claims(live_sessions=set(), looked_at=utcnow()) == 1
