"""The outbox partitioned by day of event_id on PostgreSQL, and the feed's floor per tenant
(docs/schema.md, "History partitioned by day"); nothing changes on SQLite but the two columns."""

from django.db import migrations, models

import core.schema


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0003_cancel_and_retries"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxfeedcounter",
            name="floor_key",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="outboxfeedcounter",
            name="floor_seq",
            field=models.BigIntegerField(blank=True, editable=False, null=True),
        ),
        core.schema.PartitionByDay(model_name="outboxevent", field="event_id"),
    ]
