"""The delivery loop's hot queries use their partial indexes (SQLite's plan), whatever the size
of the notifications table: the idle check runs every poll interval."""

from __future__ import annotations

import pytest
from django.db import connection

from delivery.selectors import notifications_due_exist, notifications_next_due
from delivery.services import notifications_claim
from tests.support.plans import query_plan, recorded_queries, selects_from

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's EXPLAIN QUERY PLAN")


def _plans(run) -> list[str]:
    with recorded_queries() as queries:
        run()
    return [" | ".join(query_plan(sql, params)) for sql, params in selects_from(queries, "event_notifications")]


def test_the_idle_check_searches_the_due_index(db):
    [plan] = _plans(notifications_due_exist)
    assert "event_notifications_due_seq" in plan, plan


def test_the_next_due_look_stops_short_of_the_parked_notifications(db):
    """It runs at each step of every delivery loop while tries are out: a disabled subscription's
    PARKED notifications (one more per event) wait at the due index's end, and a look that
    walked on to them whenever nothing was due took 40 % of a core at 100 calls a second."""
    [plan] = _plans(notifications_next_due)
    assert "event_notifications_due_seq (next_attempt_at<?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def test_the_claim_searches_the_due_index(db):
    plans = _plans(lambda: notifications_claim(limit=10))
    assert plans and "event_notifications_due_seq" in plans[0], plans
    # In the index's order: it stops at its limit rather than sort every due notification.
    assert "TEMP B-TREE" not in plans[0], plans


def test_the_watchdogs_release_searches_the_claimed_index_not_the_open_notifications(db):
    """It runs on every watchdog pass, when a burst may have thousands of open notifications;
    only the claims held now are in its index."""
    from core.ids import utcnow
    from delivery.services import notifications_release_dead_claims

    with recorded_queries() as queries:
        notifications_release_dead_claims(live_sessions={"alive"}, looked_at=utcnow())
    [(sql, params)] = selects_from(queries, "event_notifications")
    plan = " | ".join(query_plan(sql, params))
    assert (
        "USING COVERING INDEX event_notifications_claimed" in plan or "USING INDEX event_notifications_claimed" in plan
    ), plan
    assert "event_notifications_due_seq" not in plan, plan
