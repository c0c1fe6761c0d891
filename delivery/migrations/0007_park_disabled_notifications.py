"""The open notifications of disabled subscriptions, PARKED (delivery.models.PARKED): out of the
due index's range that every claim walks. Not out on a try: those come back to their loop."""

from datetime import UTC, datetime

from django.db import migrations
from django.db.models import Q

PARKED = datetime(9999, 12, 31, tzinfo=UTC)


def park(apps, schema_editor):
    Notification = apps.get_model("delivery", "Notification")
    now = datetime.now(UTC)
    Notification.objects.filter(subscription__enabled=False, next_attempt_at__isnull=False).filter(
        Q(locked_until__isnull=True) | Q(locked_until__lte=now)
    ).update(next_attempt_at=PARKED, locked_until=None, claimed_by=None)


def unpark(apps, schema_editor):
    Notification = apps.get_model("delivery", "Notification")
    Notification.objects.filter(next_attempt_at=PARKED).update(next_attempt_at=datetime.now(UTC))


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0006_subscription_tags"),
    ]

    operations = [migrations.RunPython(park, unpark)]
