"""Retention of notifications: those in a final state (SUCCEEDED, EXPIRED) created before the
cutoff go, with their attempts, in bounded batches; open or young ones stay; the engine's
retention run sweeps them with OUTBOX_RETENTION_DAYS, and 0 keeps everything; a disabled
subscription's old waiting ones go too."""

from __future__ import annotations

from datetime import timedelta

from core.ids import new_id, utcnow
from delivery.models import DeliveryAttempt, Notification
from delivery.services import FanoutEvent, notifications_delete_before, notifications_fan_out
from tests.support.factories import make_tenant
from tests.support.subscriptions import make_subscription


def _notifications(count: int, *, state: str, days_ago: float, subscription) -> list:
    """`count` notifications of `subscription` in `state`, created that many days ago, each
    with one attempt."""
    events = [
        FanoutEvent(
            envelope={
                "id": str(new_id()),
                "type": "ServiceCallSubmitted",
                "tenantId": "acme",
                "aggregateId": str(new_id()),
            },
            seq=n,
            created_at=utcnow(),
        )
        for n in range(count)
    ]
    notifications_fan_out(events=events)
    ids = [e.envelope["id"] for e in events]
    rows = Notification.objects.filter(subscription=subscription, event_id__in=ids)
    final = state in (Notification.State.SUCCEEDED, Notification.State.EXPIRED)
    rows.update(
        state=state,
        next_attempt_at=None if final else utcnow(),
        created_at=utcnow() - timedelta(days=days_ago),
    )
    pks = list(rows.values_list("pk", flat=True))
    for pk in pks:
        DeliveryAttempt.objects.create(notification_id=pk, n=1, trigger="scheduled", started_at=utcnow())
    return pks


def test_it_deletes_only_final_notifications_created_before_the_cutoff_in_batches(world):
    subscription, _ = make_subscription()
    delivered = _notifications(4, state="SUCCEEDED", days_ago=40, subscription=subscription)
    expired = _notifications(3, state="EXPIRED", days_ago=40, subscription=subscription)
    pending = _notifications(2, state="PENDING", days_ago=40, subscription=subscription)
    failed = _notifications(1, state="FAILED", days_ago=40, subscription=subscription)
    young = _notifications(2, state="SUCCEEDED", days_ago=1, subscription=subscription)
    batches = []

    class CountingGuard:
        def __enter__(self):
            batches.append(1)

        def __exit__(self, *exc):
            return False

    deleted = notifications_delete_before(before=utcnow() - timedelta(days=30), batch_size=3, write_guard=CountingGuard)

    assert deleted == 7
    assert len(batches) == 3  # 3 + 3 + 1: each batch its own transaction
    remaining = set(Notification.objects.values_list("pk", flat=True))
    assert remaining == set(pending) | set(failed) | set(young)
    assert not DeliveryAttempt.objects.filter(notification_id__in=delivered + expired).exists()  # cascaded
    assert DeliveryAttempt.objects.count() == len(remaining)


def test_the_engine_retention_run_deletes_old_final_notifications(settings, transactional_db):
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    settings.OUTBOX_RETENTION_DAYS = 30
    make_tenant("acme")
    subscription, _ = make_subscription()
    old = _notifications(2, state="SUCCEEDED", days_ago=31, subscription=subscription)
    young = _notifications(1, state="EXPIRED", days_ago=2, subscription=subscription)
    keeper = SessionKeeper()
    try:
        Engine(keeper).loops["retention"].step()
    finally:
        keeper.close()
    assert not Notification.objects.filter(pk__in=old).exists()
    assert Notification.objects.filter(pk__in=young).count() == 1


def test_zero_days_keeps_every_notification(settings, transactional_db):
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    settings.OUTBOX_RETENTION_DAYS = 0
    make_tenant("acme")
    subscription, _ = make_subscription()
    old = _notifications(2, state="SUCCEEDED", days_ago=3650, subscription=subscription)
    keeper = SessionKeeper()
    try:
        Engine(keeper).loops["retention"].step()
    finally:
        keeper.close()
    assert Notification.objects.filter(pk__in=old).count() == 2


def test_a_disabled_subscriptions_old_waiting_notifications_go_too(world):
    from delivery.models import Subscription

    subscription, _ = make_subscription()
    waiting = _notifications(2, state="PENDING", days_ago=40, subscription=subscription)
    young = _notifications(1, state="PENDING", days_ago=1, subscription=subscription)
    Subscription.objects.filter(pk=subscription.pk).update(enabled=False)

    assert notifications_delete_before(before=utcnow() - timedelta(days=30)) == 2
    remaining = set(Notification.objects.values_list("pk", flat=True))
    assert remaining == set(young) and not remaining & set(waiting)
