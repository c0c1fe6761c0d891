"""One failing or slow subscriber never holds back another: the claim only ever sees the head
of each (subscription, call) queue, and a subscription has a bounded number of tries in flight.
A subscription deleted while its tries are out costs nothing to the others' records."""

from __future__ import annotations

import time

import pytest
from django.db import DatabaseError

from core.ids import utcnow
from delivery import runner
from delivery.channels import webhook as webhook_channel
from delivery.models import Notification
from delivery.runner import Deliverer, deliver_now
from delivery.services import (
    SendResult,
    notifications_claim,
    notifications_record,
    subscription_create,
    subscription_delete,
    subscription_send_test,
)
from delivery.validation import SubscriptionInput
from outbox.dispatcher import dispatch_batch
from tests.delivery.receivers import receiving
from tests.support.factories import make_call, make_tenant
from tests.support.waiting import wait_for


def webhook(url: str, tenant_id: str = "acme"):
    return subscription_create(tenant_id=tenant_id, data=SubscriptionInput(kind="webhook", name="hook", url=url))[0]


def test_a_dead_subscribers_waiting_events_never_crowd_out_another_subscriber(transactional_db, world, settings):
    settings.EVENT_DELIVERY_SCHEDULE = [3600]
    with receiving() as receiver:
        dead = webhook(receiver.url("/flaky/999"), tenant_id="globex")
        for n in range(30):
            make_call("globex", name=f"c{n}", due_in=3600)  # Submitted + Scheduled each
        dispatch_batch()
        while deliver_now(limit=10):
            pass  # every call's first event fails; its second waits behind it for an hour
        assert Notification.objects.filter(subscription=dead, state=Notification.State.FAILED).count() == 30
        assert Notification.objects.filter(subscription=dead, state=Notification.State.PENDING).count() == 30

        healthy = webhook(receiver.url("/ok"))
        subscription_send_test(tenant_id="acme", subscription_id=healthy.pk)
        assert deliver_now(limit=10) == 1
    assert Notification.objects.get(subscription=healthy).state == Notification.State.SUCCEEDED


def test_a_slow_subscriber_holds_at_most_its_share_of_the_delivery_threads(transactional_db, world, settings):
    with receiving() as receiver:
        slow = webhook(receiver.url("/slow"))
        fast = webhook(receiver.url("/ok"), tenant_id="globex")
        depth = settings.DELIVERY_CLAIM_AHEAD
        for _ in range(depth * 2 + 2):
            subscription_send_test(tenant_id="acme", subscription_id=slow.pk)
        deliverer = Deliverer(concurrency=16, batch_size=16, per_subscription=2)
        try:
            deliverer.step()
            # Claimed ahead: DELIVERY_CLAIM_AHEAD times its share; tried at once: its share.
            assert deliverer.in_flight_by_subscription[slow.pk] == depth * 2
            wait_for(lambda: deliverer.sending_by_subscription[slow.pk] == 2, timeout=5)
            subscription_send_test(tenant_id="globex", subscription_id=fast.pk)
            started = time.monotonic()

            def fast_delivered():
                deliverer.step()
                return Notification.objects.get(subscription=fast).state == Notification.State.SUCCEEDED

            wait_for(fast_delivered, timeout=5)
            assert time.monotonic() - started < 1.5  # not behind the slow receiver's 2 s answers
            assert deliverer.in_flight_by_subscription[slow.pk] <= depth * 2
            assert deliverer.sending_by_subscription[slow.pk] <= 2
            assert len(receiver.at("/slow")) <= 2  # the others wait for a thread of its share
        finally:
            deliverer.stop()


def test_recording_skips_the_tries_of_a_subscription_deleted_meanwhile(transactional_db, world):
    gone = webhook("http://127.0.0.1:9/gone")
    kept = webhook("http://127.0.0.1:9/kept")
    subscription_send_test(tenant_id="acme", subscription_id=gone.pk)
    subscription_send_test(tenant_id="acme", subscription_id=kept.pk)
    claimed = notifications_claim(limit=10)
    assert len(claimed) == 2
    subscription_delete(tenant_id="acme", subscription_id=gone.pk)

    notifications_record(
        results=[(n, SendResult(succeeded=True, started_at=utcnow(), status_code=200)) for n in claimed]
    )

    assert Notification.objects.get(subscription=kept).state == Notification.State.SUCCEEDED


def test_a_deliverer_told_not_to_claim_leaves_due_notifications_and_still_records(transactional_db, world):
    """Every worker process runs a delivery loop; one whose process is busy with calls (not the
    events home) is told not to claim (docs/events.md), and the results it awaits still land."""
    busy = [False]
    with receiving() as receiver:
        subscription = webhook(receiver.url("/ok"))
        subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
        deliverer = Deliverer(concurrency=4, batch_size=4, may_claim=lambda: not busy[0])
        try:
            assert deliverer.step() == 1  # claimed, out on a thread
            busy[0] = True
            subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
            wait_for(lambda: deliverer.results.qsize() == 1, timeout=5)
            assert deliverer.step() == 1  # the first result recorded, the second left due
            states = sorted(Notification.objects.filter(subscription=subscription).values_list("state", flat=True))
            assert states == [Notification.State.PENDING, Notification.State.SUCCEEDED]
            busy[0] = False
            assert deliverer.step() == 1
            wait_for(lambda: deliverer.step() or deliverer.idle(), timeout=5)
        finally:
            deliverer.stop()
    assert set(Notification.objects.filter(subscription=subscription).values_list("state", flat=True)) == {
        Notification.State.SUCCEEDED
    }


def test_a_step_records_what_came_back_and_claims_the_next_in_one_write(transactional_db, world, monkeypatch):
    """One write transaction (one write turn) per step, whatever it does: the results that
    came back recorded, the next due claimed in their place. Should the claim fail, the results
    are still recorded on their own before the failure goes up."""
    from contextlib import contextmanager

    writes = []

    @contextmanager
    def counted():
        writes.append(1)
        yield

    with receiving() as receiver:
        subscription = webhook(receiver.url("/ok"))
        first = subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
        deliverer = Deliverer(concurrency=1, batch_size=1, write_guard=counted)
        try:
            assert deliverer.step() == 1 and len(writes) == 1  # claimed, out on the thread
            second = subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
            wait_for(lambda: deliverer.results.qsize() == 1, timeout=5)

            assert deliverer.step() == 2 and len(writes) == 2  # recorded and claimed: one write
            assert Notification.objects.get(pk=first.pk).state == Notification.State.SUCCEEDED
            assert Notification.objects.get(pk=second.pk).locked_until is not None  # its lease

            third = subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
            wait_for(lambda: deliverer.results.qsize() == 1, timeout=5)
            real_claim = runner.notifications_claim

            def failing_claim(**kwargs):
                real_claim(**kwargs)
                raise DatabaseError("the claim failed")

            monkeypatch.setattr(runner, "notifications_claim", failing_claim)
            with pytest.raises(DatabaseError):
                deliverer.step()
            monkeypatch.setattr(runner, "notifications_claim", real_claim)
            assert len(writes) == 2 + runner.RECORD_TRIES + 1  # the tries, then the recording alone
            assert Notification.objects.get(pk=second.pk).state == Notification.State.SUCCEEDED
            assert Notification.objects.get(pk=third.pk).locked_until is None  # not claimed
            assert deliverer.idle()
        finally:
            deliverer.stop()


def test_a_failing_look_for_due_work_loses_no_result(transactional_db, world, monkeypatch):
    """The database gone at the idle look: the results that came back stay to be recorded at
    the next step, and the loop's counts stay true."""
    with receiving() as receiver:
        subscription = webhook(receiver.url("/ok"))
        subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
        deliverer = Deliverer(concurrency=2, batch_size=2)
        try:
            assert deliverer.step() == 1
            wait_for(lambda: deliverer.results.qsize() == 1, timeout=5)

            def gone(**kwargs):
                raise DatabaseError("the database is gone")

            monkeypatch.setattr(runner, "notifications_next_due", gone)
            with pytest.raises(DatabaseError):
                deliverer.step()
            assert deliverer.results.qsize() == 1 and deliverer.in_flight == 1
            monkeypatch.undo()
            assert deliverer.step() == 1 and deliverer.idle()
        finally:
            deliverer.stop()
    assert Notification.objects.get(subscription=subscription).state == Notification.State.SUCCEEDED


def test_a_try_that_raises_is_a_failed_try_and_the_next_one_goes_out(transactional_db, world, monkeypatch):
    with receiving() as receiver:
        subscription = webhook(receiver.url("/ok"))
        first = subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
        deliverer = Deliverer(concurrency=1, batch_size=1)
        try:

            def broken(notification, started):
                raise RuntimeError("a bug in the sender")

            monkeypatch.setattr(webhook_channel, "webhook_request", broken)
            assert deliverer.step() == 1
            wait_for(lambda: deliverer.results.qsize() == 1, timeout=5)
            monkeypatch.undo()
            second = subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
            assert deliverer.step() == 2  # the failure recorded, the next claimed and sent
            wait_for(lambda: deliverer.results.qsize() == 1, timeout=5)
            deliverer.record_ready()
        finally:
            deliverer.stop()
    failed = Notification.objects.get(pk=first.pk)
    assert (failed.state, failed.last_error) == (Notification.State.FAILED, "RuntimeError: a bug in the sender")
    assert Notification.objects.get(pk=second.pk).state == Notification.State.SUCCEEDED
    assert deliverer.idle() and deliverer._trying == 0 and not deliverer.sending_by_subscription


def test_a_failed_hand_over_to_the_sender_is_a_failed_try_and_frees_its_place(transactional_db, world, monkeypatch):
    """Whatever goes wrong between a claim and the sender, each try ends with a result and gives
    its place back: none is lost, no place leaks."""

    class Broken:
        def submit(self, requests):
            raise RuntimeError("the sender is gone")

    with receiving() as receiver:
        subscription = webhook(receiver.url("/ok"))
        tries = [subscription_send_test(tenant_id="acme", subscription_id=subscription.pk) for _ in range(3)]
        deliverer = Deliverer(concurrency=2, batch_size=3)
        try:
            monkeypatch.setattr(webhook_channel, "sender", lambda: Broken())
            assert deliverer.step() == 3
            wait_for(lambda: deliverer.results.qsize() == 3, timeout=5)
            deliverer.record_ready()
            assert deliverer.idle() and deliverer._trying == 0 and not deliverer.sending_by_subscription
        finally:
            deliverer.stop()
    failed = Notification.objects.filter(pk__in=[t.pk for t in tries])
    assert {(n.state, n.last_error) for n in failed} == {
        (Notification.State.FAILED, "RuntimeError: the sender is gone")
    }


def test_a_claimed_try_that_could_not_end_within_its_lease_is_not_started(transactional_db, world, monkeypatch):
    """Claimed ahead, a try waits for a thread; one that could no longer end before its lease
    does is left to the lease (another loop may claim it then, and must not find it out
    twice), untried."""
    with receiving() as receiver:
        subscription = webhook(receiver.url("/ok"))
        waiting = subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
        monkeypatch.setattr(runner, "longest_try_ms", lambda: 3_600_000)  # longer than any lease
        deliverer = Deliverer(concurrency=1, batch_size=1)
        try:
            assert deliverer.step() == 1
            wait_for(deliverer.idle, timeout=5)
        finally:
            deliverer.stop()
        assert receiver.at("/ok") == []
    left = Notification.objects.get(pk=waiting.pk)
    assert left.state == Notification.State.PENDING and left.locked_until > utcnow()


def test_only_the_events_home_delivers_while_its_attempts_are_sending(transactional_db):
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    keeper = SessionKeeper()
    try:
        engine = Engine(keeper, timer=True, events=False)
        assert engine._may_deliver()
        engine.in_flight = 3
        assert not engine._may_deliver()
        engine.waiting = 3  # attempts started ahead, waiting for their due time, send nothing
        assert engine._may_deliver()
        engine.waiting = 2
        assert not engine._may_deliver()
        engine.hosts_events = True  # e.g. it took the vacant events role
        assert engine._may_deliver()
    finally:
        keeper.close()


def test_between_steps_the_loop_lets_a_quarter_of_the_tries_out_come_back_first(transactional_db, world):
    """After a step that moved something, the loop waits (up to a bound) for a quarter of the
    tries in flight, so one claim and one recording serve many notifications; with nothing
    out, it does not wait at all."""
    with receiving() as receiver:
        fast, slow = webhook(receiver.url("/ok")), webhook(receiver.url("/delay/1500"))
        deliverer = Deliverer(concurrency=8, batch_size=8)
        try:
            began = time.monotonic()
            deliverer.gather(5.0)
            assert time.monotonic() - began < 1.0  # nothing out: no wait

            for _ in range(4):
                subscription_send_test(tenant_id="acme", subscription_id=slow.pk)
            assert deliverer.step() == 4
            began = time.monotonic()
            deliverer.gather(0.2)  # none of the 4 (1.5 s each) is back: the bound ends the wait
            assert 0.2 <= time.monotonic() - began < 1.2

            subscription_send_test(tenant_id="acme", subscription_id=fast.pk)
            assert deliverer.step() == 1  # 5 out: a quarter is 1, the fast one
            began = time.monotonic()
            deliverer.gather(5.0)
            assert time.monotonic() - began < 1.2 and deliverer.results.qsize() >= 1
        finally:
            deliverer.stop()
    assert Notification.objects.filter(state=Notification.State.SUCCEEDED).count() == 5


def test_a_stopping_loop_records_the_tries_that_come_back_in_time_and_gives_back_the_unstarted(transactional_db, world):
    """A worker stopping (a deploy) waits a bounded time for its tries out: those back in time
    are recorded, not sent again after their lease; claims no thread started are due again at
    once; a try still out at the bound is left to its lease (at least once)."""
    with receiving() as receiver:
        quick, slow = webhook(receiver.url("/delay/300")), webhook(receiver.url("/slow"))

        # Back within the bound: recorded by the stop itself.
        subscription_send_test(tenant_id="acme", subscription_id=quick.pk)
        deliverer = Deliverer(concurrency=4, batch_size=4)
        assert deliverer.step() == 1
        wait_for(lambda: deliverer.sending_by_subscription[quick.pk] == 1, timeout=5)  # out
        deliverer.stop(timeout=5.0)
        assert Notification.objects.get(subscription=quick).state == Notification.State.SUCCEEDED

        # Claimed ahead, waiting behind busy threads: given back, due now, not leased, never sent.
        slow_out = [subscription_send_test(tenant_id="acme", subscription_id=slow.pk) for _ in range(2)]
        deliverer = Deliverer(concurrency=2, batch_size=4)
        assert deliverer.step() == 2
        wait_for(lambda: deliverer.sending_by_subscription[slow.pk] == 2, timeout=5)  # both threads busy
        subscription_send_test(tenant_id="acme", subscription_id=quick.pk)
        subscription_send_test(tenant_id="acme", subscription_id=quick.pk)
        assert deliverer.step() == 2  # claimed ahead: 4 out for 2 threads
        deliverer.stop(timeout=0.2)
        waiting = Notification.objects.filter(subscription=quick, state=Notification.State.PENDING)
        assert waiting.count() == 2
        assert all(n.locked_until is None and n.next_attempt_at <= utcnow() for n in waiting)
        Notification.objects.filter(subscription=quick).delete()
        wait_for(lambda: len(receiver.at("/slow")) == 2, timeout=5)
        for notification in slow_out:  # still out at the bound: left to their lease
            notification.refresh_from_db()
            assert notification.state == Notification.State.PENDING and notification.locked_until > utcnow()
        Notification.objects.filter(subscription=slow).delete()

        # Still out at the bound (the receiver answers after 2 s): left to its lease.
        subscription_send_test(tenant_id="acme", subscription_id=slow.pk)
        deliverer = Deliverer(concurrency=4, batch_size=4)
        assert deliverer.step() == 1
        wait_for(lambda: deliverer.sending_by_subscription[slow.pk] == 1, timeout=5)  # out
        began = time.monotonic()
        deliverer.stop(timeout=0.2)
        assert time.monotonic() - began < 1.5
        left = Notification.objects.get(subscription=slow)
        assert left.state == Notification.State.PENDING and left.locked_until > utcnow()
        assert len(receiver.at("/delay/300")) == 1  # the given-back ones were never sent


def test_a_tenants_slow_subscribers_together_hold_at_most_its_share_of_the_delivery_threads(
    transactional_db, world, settings
):
    """Eight slow subscriptions of one tenant, each within its own cap, would fill every thread
    between them: the tenant's cap keeps the rest for the others (docs/events.md, "Fair shares")."""
    with receiving() as receiver:
        slow = [webhook(receiver.url("/slow"), tenant_id="globex") for _ in range(8)]
        fast = webhook(receiver.url("/ok"))
        for subscription in slow:
            for _ in range(6):
                subscription_send_test(tenant_id="globex", subscription_id=subscription.pk)
        deliverer = Deliverer(concurrency=8, batch_size=64, per_subscription=2, per_tenant=4)
        try:
            deliverer.step()
            assert deliverer.in_flight_by_tenant["globex"] == settings.DELIVERY_CLAIM_AHEAD * 4
            wait_for(lambda: deliverer.sending_by_tenant["globex"] == 4, timeout=5)
            _ping_is_delivered_at_once(deliverer, fast)
            assert deliverer.sending_by_tenant["globex"] <= 4
            assert deliverer.in_flight_by_tenant["globex"] <= settings.DELIVERY_CLAIM_AHEAD * 4
            assert len(receiver.at("/slow")) <= 4  # the others wait for a thread of its share
        finally:
            deliverer.stop()


def test_two_noisy_tenants_leave_the_reserve_to_a_quiet_one(transactional_db, world, settings):
    """Each noisy tenant within its share, the two together would hold every thread: the
    second takes of the reserve only what a tenant holding few may (core.fairness.ShareRule)."""
    make_tenant("initech")
    with receiving() as receiver:
        noisy = [webhook(receiver.url("/slow"), tenant_id=t) for t in ("globex", "initech") for _ in range(4)]
        fast = webhook(receiver.url("/ok"))
        for subscription in noisy:
            for _ in range(4):
                subscription_send_test(tenant_id=subscription.tenant_id, subscription_id=subscription.pk)
        deliverer = Deliverer(concurrency=8, batch_size=64, per_subscription=2, per_tenant=4)
        try:
            deliverer.step()
            wait_for(lambda: deliverer.sending_by_tenant["globex"] + deliverer.sending_by_tenant["initech"] >= 4)
            _ping_is_delivered_at_once(deliverer, fast)
            # Together they hold at most a share (4 of 8) and a light tenant's part of the reserve
            # (1): the rest of the reserve was the quiet tenant's.
            assert deliverer.sending_by_tenant["globex"] + deliverer.sending_by_tenant["initech"] <= 5
            assert len(receiver.at("/slow")) <= 5
        finally:
            deliverer.stop()


def _ping_is_delivered_at_once(deliverer, subscription) -> None:
    """A test ping to `subscription` is delivered within 1.5 s: not behind the slow receivers'
    2 s answers."""
    subscription_send_test(tenant_id=subscription.tenant_id, subscription_id=subscription.pk)
    started = time.monotonic()

    def delivered():
        deliverer.step()
        return Notification.objects.get(subscription=subscription).state == Notification.State.SUCCEEDED

    wait_for(delivered, timeout=5)
    assert time.monotonic() - started < 1.5
