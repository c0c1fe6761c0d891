"""Loop runs partitioned by day of their start on PostgreSQL (docs/schema.md, "History
partitioned by day"); nothing changes on SQLite."""

from django.db import migrations

import core.schema


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0006_loop_names_in_python"),
    ]

    operations = [
        core.schema.PartitionByDay(model_name="looprun", field="started_at"),
    ]
