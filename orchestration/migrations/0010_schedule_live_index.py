from django.db import migrations, models

import core.schema


class Migration(migrations.Migration):
    # Built concurrently on PostgreSQL (core/schema.py), which no transaction may hold.
    atomic = core.schema.AtomicElsewhere()

    dependencies = [
        ("orchestration", "0009_schedule_overlap"),
    ]

    operations = [
        core.schema.AddIndexConcurrently(
            model_name="servicecall",
            index=models.Index(
                condition=models.Q(("schedule_id__isnull", False), ("status__in", ["Scheduled", "Running"])),
                fields=["tenant", "schedule_id", "occurrence_at"],
                name="service_calls_schedule_live",
            ),
        ),
    ]
