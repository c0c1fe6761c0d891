"""Event notifications and their delivery tries partitioned by day of the notification's id on
PostgreSQL (docs/schema.md, "History partitioned by day"): a notification's id bears its
event's time (core.ids.new_id_dated_as), so one event's notifications, and their tries, share a
day. The window of the open notifications keeps the delivery loops' queries to a few partitions."""

from __future__ import annotations

from core.db.wakeups import Channel
from core.partition_queries import OpenWindow
from core.partitions import DailyPartitions
from delivery.models import DeliveryAttempt, Notification

NOTIFICATION_DAYS = DailyPartitions(Notification._meta.db_table, Notification._meta.pk.column)
ATTEMPT_DAYS = DailyPartitions(DeliveryAttempt._meta.db_table, DeliveryAttempt._meta.get_field("notification").column)
# Open: PENDING or FAILED, as the partial indexes say it (delivery/models.py).
OPEN_SQL = "next_attempt_at IS NOT NULL"
# Every commit that opens a notification (made, resent, recovered, given back, its subscription
# enabled) notifies the delivery channel.
OPEN = OpenWindow(NOTIFICATION_DAYS, OPEN_SQL, channel=Channel.DELIVERY)
