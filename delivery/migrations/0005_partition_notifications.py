"""Event notifications and their delivery tries partitioned by day of the notification's id on
PostgreSQL (docs/schema.md, "History partitioned by day"); nothing changes on SQLite."""

from django.db import migrations

import core.schema


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0004_covered_fk_indexes"),
    ]

    operations = [
        # Drops the tries' foreign key to the notifications (made again on the way back).
        core.schema.PartitionByDay(model_name="notification", field="notification_id"),
        core.schema.PartitionByDay(model_name="deliveryattempt", field="notification"),
    ]
