"""The outbox partitioned by day of event_id on PostgreSQL (docs/schema.md, "History partitioned
by day"): its layout, and the window of its unpublished events, which the dispatcher's queries
keep to so that they plan and read a few partitions, not every day retention keeps."""

from __future__ import annotations

from core.db.wakeups import Channel
from core.partition_queries import OpenWindow
from core.partitions import DailyPartitions
from outbox.models import OutboxEvent

OUTBOX_DAYS = DailyPartitions(OutboxEvent._meta.db_table, OutboxEvent._meta.get_field("event_id").column)
UNPUBLISHED_SQL = "published_at IS NULL"
# Every commit that leaves an event unpublished (appended, published again) notifies the outbox.
UNPUBLISHED = OpenWindow(OUTBOX_DAYS, UNPUBLISHED_SQL, channel=Channel.OUTBOX)
