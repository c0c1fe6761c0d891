"""Handed over at the fan-out (docs/events.md): the notifications that head their (subscription,
call) queue are made claimed for the dispatcher's own delivery loop and tried once the fan-out
commits, with no claim of their own; the rest wait in the queue or for any loop's claim, as
before. What is handed stays within the loop's room; a fan-out rolled back hands nothing and
holds no room; a redelivered event is never tried twice for one row."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import transaction

from core.ids import new_id, utcnow
from delivery import runner
from delivery.fanout import NotificationSink
from delivery.models import DeliveryAttempt, Notification, Subscription
from delivery.runner import Deliverer
from delivery.services import FanoutEvent, notifications_fan_out, subscription_update
from delivery.validation import SubscriptionInput
from outbox.dispatcher import dispatch_batch
from outbox.sinks import LogSink
from tests.delivery.receivers import receiving
from tests.support.factories import make_call
from tests.support.subscriptions import make_subscription
from tests.support.waiting import wait_for

# Both databases: the fan-out's count of the rows it made (a redelivered pair is skipped) is
# each driver's executemany rowcount.
pytestmark = pytest.mark.also_postgres

SESSION = "worker-session-1"


def _event(call, seq: int, tenant_id: str = "acme") -> FanoutEvent:
    envelope = {"id": str(new_id()), "type": "ServiceCallSubmitted", "tenantId": tenant_id, "aggregateId": str(call)}
    return FanoutEvent(envelope=envelope, seq=seq, created_at=utcnow())


def test_the_dispatcher_hands_each_queues_head_to_its_loop_and_the_rest_follow_in_order(transactional_db, world):
    with receiving() as receiver:
        subscription, secret = make_subscription(url=receiver.url("/ok"))
        receiver.secrets.append(secret)
        calls = [make_call("acme", name=f"c{n}", due_in=3600) for n in range(3)]  # Submitted, Scheduled each
        deliverer = Deliverer(concurrency=8, batch_size=8, session=lambda: SESSION)
        try:
            published = dispatch_batch(sinks=(LogSink(), NotificationSink(offer=deliverer.offer)))
            assert published == 6
            # Made claimed: each call's first event, for this loop's session; its second waits
            # behind it, due, for any loop's claim once the first is done.
            rows = {(n.aggregate_id, n.event_type): n for n in Notification.objects.all()}
            for call in calls:
                head, second = rows[(call.pk, "ServiceCallSubmitted")], rows[(call.pk, "ServiceCallScheduled")]
                assert head.claimed_by == SESSION and head.locked_until > utcnow()
                assert head.next_attempt_at == head.locked_until
                assert second.claimed_by is None and second.locked_until is None
            assert deliverer.in_flight == 3

            deliverer.offers_done()  # the dispatcher's loop, after its batch: the tries start
            wait_for(lambda: len(receiver.at("/ok")) == 3, timeout=5)
            assert {e["type"] for e in receiver.envelopes()} == {"ServiceCallSubmitted"}
            assert all(r.verified_with == [secret] for r in receiver.at("/ok"))

            # The loop records them and claims the second events, now the heads.
            wait_for(lambda: deliverer.results.qsize() == 3, timeout=5)
            assert deliverer.step() == 6
            wait_for(lambda: len(receiver.at("/ok")) == 6, timeout=5)
            wait_for(lambda: deliverer.results.qsize() == 3, timeout=5)
            deliverer.step()
            assert deliverer.idle()
        finally:
            deliverer.stop()
    by_call: dict = {}
    for envelope in receiver.envelopes():
        by_call.setdefault(envelope["aggregateId"], []).append(envelope["type"])
    assert by_call == {str(c.pk): ["ServiceCallSubmitted", "ServiceCallScheduled"] for c in calls}
    assert Notification.objects.filter(subscription=subscription, state=Notification.State.SUCCEEDED).count() == 6
    assert DeliveryAttempt.objects.count() == 6


def test_a_handed_head_is_tried_as_the_dispatch_ends_with_no_step_of_the_loop(transactional_db, world):
    with receiving() as receiver:
        make_subscription(url=receiver.url("/ok"))
        deliverer = Deliverer(concurrency=4, batch_size=4, session=lambda: SESSION)
        try:
            notifications_fan_out(events=[_event(new_id(), 1), _event(new_id(), 2)], offer=deliverer.offer())
            assert not Notification.objects.filter(next_attempt_at__lte=utcnow()).exists()  # none due
            deliverer.offers_done()
            wait_for(lambda: deliverer.results.qsize() == 2, timeout=5)
            deliverer.record_ready()
        finally:
            deliverer.stop()
    assert len(receiver.at("/ok")) == 2
    assert Notification.objects.filter(state=Notification.State.SUCCEEDED, claimed_by=None).count() == 2


def test_only_what_the_loop_has_room_for_is_handed_and_the_rest_is_claimed_as_before(transactional_db, world, settings):
    settings.DELIVERY_CLAIM_AHEAD = 1
    with receiving() as receiver:
        busy = make_subscription(url=receiver.url("/ok"))[0]
        other = make_subscription(url=receiver.url("/ok"), name="other")[0]
        # Room for 8 in all, 2 of one subscription: 6 heads made, 4 handed (2 each).
        deliverer = Deliverer(concurrency=8, batch_size=8, per_subscription=2, session=lambda: SESSION)
        try:
            notifications_fan_out(events=[_event(new_id(), n) for n in range(3)], offer=deliverer.offer())
            handed = Notification.objects.filter(claimed_by=SESSION)
            assert handed.count() == 4
            assert {n.subscription_id for n in handed} == {busy.pk, other.pk}
            assert handed.filter(subscription=busy).count() == 2
            assert deliverer.in_flight == 4 and deliverer.in_flight_by_subscription[busy.pk] == 2
            assert deliverer.in_flight_by_subscription[other.pk] == 2
            due = Notification.objects.filter(claimed_by=None, locked_until=None, next_attempt_at__lte=utcnow())
            assert due.count() == 2
            deliverer.offers_done()
            wait_for(lambda: deliverer.results.qsize() == 4, timeout=5)
            assert deliverer.step() == 4 + 2  # recorded, and the two left claimed as before
            wait_for(lambda: deliverer.results.qsize() == 2, timeout=5)
            deliverer.step()
        finally:
            deliverer.stop()
    assert len(receiver.at("/ok")) == 6
    assert Notification.objects.filter(state=Notification.State.SUCCEEDED).count() == 6


def test_nothing_is_handed_behind_an_open_notification_or_to_a_disabled_subscription(transactional_db, world):
    enabled = make_subscription()[0]
    disabled = make_subscription(name="off")[0]
    subscription_update(tenant_id="acme", subscription_id=disabled.pk, data=SubscriptionInput(enabled=False))
    waiting_call, fresh_call = new_id(), new_id()
    notifications_fan_out(events=[_event(waiting_call, 1)])  # open, for anyone's claim
    deliverer = Deliverer(concurrency=8, batch_size=8, session=lambda: SESSION)
    notifications_fan_out(events=[_event(waiting_call, 2), _event(fresh_call, 3)], offer=deliverer.offer())
    [handed] = Notification.objects.filter(claimed_by=SESSION)
    assert (handed.subscription_id, handed.aggregate_id) == (enabled.pk, fresh_call)
    assert deliverer.in_flight == 1
    deliverer.stop(timeout=0)  # gives the handed one back, untried
    assert deliverer.in_flight == 0
    handed.refresh_from_db()
    assert handed.claimed_by is None and handed.locked_until is None


def test_a_rolled_back_fan_out_hands_nothing_and_holds_no_room(transactional_db, world):
    make_subscription()
    deliverer = Deliverer(concurrency=8, batch_size=8, session=lambda: SESSION)
    with pytest.raises(RuntimeError), transaction.atomic():
        notifications_fan_out(events=[_event(new_id(), 1), _event(new_id(), 2)], offer=deliverer.offer())
        assert deliverer.in_flight == 2  # held while the transaction runs
        raise RuntimeError("the dispatcher's batch failed")
    deliverer.offers_done()
    assert deliverer.in_flight == 0 and not deliverer.in_flight_by_subscription
    assert not Notification.objects.exists()
    assert not deliverer._waiting


def test_a_redelivered_event_is_not_handed_again(transactional_db, world):
    make_subscription()
    event = _event(new_id(), 1)
    notifications_fan_out(events=[event])
    Notification.objects.update(state=Notification.State.SUCCEEDED, next_attempt_at=None, delivered_at=utcnow())
    deliverer = Deliverer(concurrency=8, batch_size=8, session=lambda: SESSION)
    notifications_fan_out(events=[event], offer=deliverer.offer())  # the pair exists: nothing made
    assert not deliverer._waiting
    deliverer.offers_done()
    assert deliverer.in_flight == 0
    assert Notification.objects.get().state == Notification.State.SUCCEEDED


def test_no_offer_while_the_session_is_unsure_or_the_loop_stopping(transactional_db, world):
    unsure = Deliverer(concurrency=8, batch_size=8, session=lambda: None)
    assert unsure.offer() is None
    stopped = Deliverer(concurrency=8, batch_size=8, session=lambda: SESSION)
    stopped.stop(timeout=0)
    assert stopped.offer() is None
    full = Deliverer(concurrency=1, batch_size=1, session=lambda: SESSION)
    full.claim_ahead = 1
    assert full.offer().reserve(Subscription(subscription_id=new_id()))
    assert full.offer() is None  # its room all taken: the fan-out looks for no heads
    settled = Deliverer(concurrency=8, batch_size=8, session=lambda: SESSION)
    offer = settled.offer()
    settled.offers_done()
    assert not offer.reserve(Subscription(subscription_id=new_id()))  # an offer given back takes no more room


class _ElsewhereSink:
    """A sink that publishes outside the database: the dispatcher takes its leased path."""

    name = "elsewhere"
    in_transaction = False

    def publish(self, envelopes) -> None:
        pass


def test_nothing_is_handed_on_the_dispatchers_leased_path(transactional_db, world):
    """There two dispatchers may fan out one call's events at once (no turns are taken), and
    each would hand its own as the head of the queue."""
    make_subscription()
    make_call("acme", name="c", due_in=3600)
    deliverer = Deliverer(concurrency=8, batch_size=8, session=lambda: SESSION)
    assert dispatch_batch(sinks=(_ElsewhereSink(), NotificationSink(offer=deliverer.offer))) == 2
    deliverer.offers_done()
    assert Notification.objects.count() == 2
    assert not Notification.objects.filter(claimed_by=SESSION).exists()
    assert deliverer.in_flight == 0


class _FailsOnBatches:
    """Fails a batch of more than one event: the dispatcher publishes it again event by event,
    each in a savepoint of the same transaction."""

    name = "batches"
    in_transaction = True

    def publish(self, envelopes) -> None:
        if len(envelopes) > 1:
            raise RuntimeError("one at a time, please")


def test_after_a_failed_batch_only_the_events_published_one_by_one_are_handed(transactional_db, world):
    make_subscription()
    calls = [make_call("acme", name=f"c{n}", due_in=3600) for n in range(2)]
    deliverer = Deliverer(concurrency=8, batch_size=8, session=lambda: SESSION)
    sinks = (NotificationSink(offer=deliverer.offer), _FailsOnBatches())
    assert dispatch_batch(sinks=sinks) == 4
    # The batch's fan-out was rolled back with its savepoint (its hand-over with it); the
    # one-by-one fan-outs handed each call's first event.
    handed = Notification.objects.filter(claimed_by=SESSION)
    assert {(n.aggregate_id, n.event_type) for n in handed} == {(c.pk, "ServiceCallSubmitted") for c in calls}
    assert Notification.objects.count() == 4
    assert deliverer.in_flight == 4  # the rolled-back batch's room is held until the dispatch ends
    assert sum(len(batch) for batch in deliverer._waiting) == 2  # the rolled-back hand-over never came
    deliverer.stop(timeout=0)  # before offers_done starts the tries: given back untried
    deliverer.offers_done()  # the rolled-back batch's room comes back
    assert deliverer.in_flight == 0 and not deliverer.in_flight_by_subscription


def test_a_claim_waiting_for_its_write_turn_counts_what_an_offer_took_meanwhile(transactional_db, world, settings):
    """The dispatcher's fan-out and the loop's claim write in turn (the engine's write gate): the
    claim reckons its room once its turn came, so a subscription never has more than its share
    claimed, however the two interleave."""
    settings.DELIVERY_CLAIM_AHEAD = 1
    subscription = make_subscription()[0]
    for n in range(4):  # due, for the loop's claim
        notifications_fan_out(events=[_event(new_id(), n)])
    turn = threading.Lock()
    deliverer = Deliverer(concurrency=8, batch_size=8, per_subscription=2, write_guard=lambda: turn)
    claims, stepped = [], []
    real_claim = runner.notifications_claim

    def claim(**kwargs):
        claims.append(dict(kwargs["in_flight"]))
        return real_claim(**kwargs)

    runner.notifications_claim = claim
    try:
        with turn:  # the dispatcher's turn: the loop's step waits for it
            stepping = threading.Thread(target=lambda: stepped.append(deliverer.step()))
            stepping.start()
            time.sleep(0.2)
            notifications_fan_out(events=[_event(new_id(), 10), _event(new_id(), 11)], offer=deliverer.offer())
            assert deliverer.in_flight_by_subscription[subscription.pk] == 2  # its share, handed
        stepping.join(5)
        assert not stepping.is_alive() and stepped == [0]  # the step ran, and claimed none
        assert claims == [{subscription.pk: 2}]  # it saw what the offer took
        assert deliverer.in_flight_by_subscription[subscription.pk] == 2
        assert Notification.objects.filter(locked_until__isnull=False).count() == 2
    finally:
        runner.notifications_claim = real_claim
        deliverer.offers_done()
        deliverer.stop(timeout=0)


def test_a_hand_over_committed_after_its_dispatch_ended_is_still_counted(transactional_db, world):
    """Should a dispatch run inside a caller's transaction, its fan-out commits after
    offers_done gave the room back: the tries are counted again, never lost from the count."""
    make_subscription()
    deliverer = Deliverer(concurrency=8, batch_size=8, session=lambda: SESSION)
    with transaction.atomic():
        notifications_fan_out(events=[_event(new_id(), 1), _event(new_id(), 2)], offer=deliverer.offer())
        deliverer.offers_done()
        assert deliverer.in_flight == 0
    assert deliverer.in_flight == 2 == sum(len(batch) for batch in deliverer._waiting)
    deliverer.stop(timeout=0)
    assert deliverer.in_flight == 0


def test_the_loops_own_claim_and_an_offer_never_hold_more_than_its_room(transactional_db, world, settings):
    """A claim in progress holds its room: an offer made meanwhile sees it taken."""
    settings.DELIVERY_CLAIM_AHEAD = 1
    make_subscription()
    for n in range(4):
        notifications_fan_out(events=[_event(new_id(), n)])
    deliverer = Deliverer(concurrency=4, batch_size=4, session=lambda: SESSION)
    seen = []

    def claim_and_look(**kwargs):
        offer = deliverer.offer()
        seen.append(offer is not None and offer.reserve(Notification.objects.first().subscription))
        return original(**kwargs)

    original = runner.notifications_claim
    runner.notifications_claim = claim_and_look
    try:
        assert deliverer.step() == 4
    finally:
        runner.notifications_claim = original
        deliverer.offers_done()
        deliverer.stop(timeout=0)
    assert seen == [False]
