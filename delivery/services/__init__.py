"""Writes of the delivery module: subscriptions, the fan-out of events into notifications, and
each notification's state as it is tried (docs/events.md).

One module per subject: `subscriptions` (made, changed, deleted, secrets rotated), `operations`
(test event, recover, resend), `fanout` (events into notifications), `claims` (the delivery
loop's leases, given back), `record` (results and retries), `retention`. What a try reads and
gives (`ClaimedNotification`, `SendResult`) is delivery.tries'. Import from `delivery.services`:
the names below are its public ones.
"""

from delivery.channels.webhook import new_webhook_secret
from delivery.services.claims import (
    LEASE,
    lease_length,
    longest_try_ms,
    notifications_claim,
    notifications_release,
    notifications_release_dead_claims,
)
from delivery.services.fanout import ClaimOffer, FanoutEvent, notifications_fan_out
from delivery.services.operations import PING_TYPE, notification_resend, subscription_recover, subscription_send_test
from delivery.services.record import GONE_REASON, REFUSED_REASON, notifications_record, retry_delay
from delivery.services.retention import RETENTION_BATCH, notifications_delete_before, notifications_partitions_make
from delivery.services.subscriptions import (
    EXPIRED_WHILE_DISABLED,
    ROTATION_OVERLAP,
    nats_subscription_ensure,
    subscription_create,
    subscription_delete,
    subscription_rotate_secret,
    subscription_secrets_rotate,
    subscription_update,
)
from delivery.tries import ClaimedNotification, SendResult

__all__ = [
    "EXPIRED_WHILE_DISABLED",
    "GONE_REASON",
    "LEASE",
    "PING_TYPE",
    "REFUSED_REASON",
    "RETENTION_BATCH",
    "ROTATION_OVERLAP",
    "ClaimOffer",
    "ClaimedNotification",
    "FanoutEvent",
    "SendResult",
    "lease_length",
    "longest_try_ms",
    "nats_subscription_ensure",
    "new_webhook_secret",
    "notification_resend",
    "notifications_claim",
    "notifications_delete_before",
    "notifications_fan_out",
    "notifications_partitions_make",
    "notifications_record",
    "notifications_release",
    "notifications_release_dead_claims",
    "retry_delay",
    "subscription_create",
    "subscription_delete",
    "subscription_recover",
    "subscription_rotate_secret",
    "subscription_secrets_rotate",
    "subscription_send_test",
    "subscription_update",
]
