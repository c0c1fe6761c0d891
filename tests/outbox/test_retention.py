"""Retention of published outbox events: old published rows go in bounded batches, nothing
unpublished or young is touched, and OUTBOX_RETENTION_DAYS=0 keeps everything."""

from datetime import timedelta

from core.ids import utcnow
from outbox.models import OutboxEvent
from outbox.services import outbox_delete_published_before
from tests.support.factories import make_event
from tests.support.waiting import wait_for


def _events(count, *, published_days_ago=None):
    """The ids of `count` new events, published that many days ago when given."""
    return [make_event(payload={"n": n}, published_days_ago=published_days_ago).pk for n in range(count)]


def test_it_deletes_only_events_published_before_the_cutoff_in_batches(db):
    old = _events(7, published_days_ago=40)
    young = _events(2, published_days_ago=1)
    unpublished = _events(3)
    batches = []

    class CountingGuard:
        def __enter__(self):
            batches.append(1)

        def __exit__(self, *exc):
            return False

    deleted = outbox_delete_published_before(
        before=utcnow() - timedelta(days=30), batch_size=3, write_guard=CountingGuard
    )

    assert deleted == 7
    assert len(batches) == 3  # 3 + 3 + 1: each batch its own transaction
    remaining = set(OutboxEvent.objects.values_list("pk", flat=True))
    assert remaining == set(young) | set(unpublished)
    assert not remaining & set(old)


def test_it_deletes_nothing_when_nothing_is_old_enough(db):
    kept = _events(2, published_days_ago=29)
    assert outbox_delete_published_before(before=utcnow() - timedelta(days=30)) == 0
    assert OutboxEvent.objects.filter(pk__in=kept).count() == 2


def test_the_engine_sweeps_old_published_events_on_its_retention_run(settings, transactional_db, engine):
    settings.OUTBOX_RETENTION_DAYS = 30
    old = _events(3, published_days_ago=31)
    young = _events(1, published_days_ago=2)
    wait_for(lambda: not OutboxEvent.objects.filter(pk__in=old).exists(), timeout=15)
    assert OutboxEvent.objects.filter(pk__in=young).count() == 1


def test_zero_days_keeps_every_event(settings, transactional_db):
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    settings.OUTBOX_RETENTION_DAYS = 0
    old = _events(2, published_days_ago=3650)
    keeper = SessionKeeper()
    try:
        Engine(keeper).loops["retention"].step()
    finally:
        keeper.close()
    assert OutboxEvent.objects.filter(pk__in=old).count() == 2
