from django.db import migrations, models

import core.schema


class Migration(migrations.Migration):
    # Built concurrently on PostgreSQL (core/schema.py), which no transaction may hold.
    atomic = core.schema.AtomicElsewhere()

    dependencies = [
        ("orchestration", "0010_schedule_live_index"),
    ]

    operations = [
        core.schema.AddIndexConcurrently(
            model_name="servicecall",
            index=models.Index(
                condition=models.Q(("overlap_state", "skipped")),
                fields=["tenant", "schedule_id"],
                name="service_calls_overlap_skipped",
            ),
        ),
    ]
