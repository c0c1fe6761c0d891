"""In order per call and subscriber (docs/events.md) where the notifications are partitioned by day
(PostgreSQL): the delivery loop's claim looks for open notifications in the window of the open
ones (docs/schema.md, "History partitioned by day"), and a call older than the window may have
an earlier open notification below it, made a moment ago by a late fan-out and not yet in the
window a process keeps for a second. Such a call's later event still waits behind it."""

from __future__ import annotations

import pytest

from delivery.models import Subscription
from delivery.partitions import OPEN
from delivery.services import notifications_claim
from tests.support.factories import make_event
from tests.support.partitions import at_days_ago, dated, days_made, forget_windows
from tests.support.subscriptions import fan_out, make_subscription

pytestmark = pytest.mark.postgres


def test_a_late_events_notification_is_waited_for_though_the_window_was_looked_for_before_it(world):
    subscription, _ = make_subscription()
    Subscription.objects.filter(pk=subscription.pk).update(created_at=at_days_ago(5))
    days_made([3])
    call = dated(OPEN.spec, at_days_ago(3))
    earlier = make_event(aggregate_id=call, made_at=at_days_ago(3))  # published three days late
    later = make_event(aggregate_id=call)
    forget_windows()
    assert notifications_claim(limit=10) == []  # the window, looked for before the fan-out: from yesterday

    first, second = fan_out(call)
    assert (first.event_id, second.event_id) == (earlier.event_id, later.event_id)

    assert notifications_claim(limit=10) == []  # the later one waits; the earlier is not in the window yet
    forget_windows()  # a second later
    assert [claimed.pk for claimed in notifications_claim(limit=10)] == [first.pk]
