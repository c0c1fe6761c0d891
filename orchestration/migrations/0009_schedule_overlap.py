from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("orchestration", "0008_credential_error"),
        ("tenants", "0003_tenant_ceilings"),
    ]

    operations = [
        migrations.AddField(
            model_name="servicecall",
            name="overlap",
            field=models.CharField(blank=True, db_default="", default="", max_length=12),
        ),
        migrations.AddField(
            model_name="servicecall",
            name="overlap_state",
            field=models.CharField(blank=True, db_default="", default="", max_length=12),
        ),
        migrations.AddConstraint(
            model_name="servicecall",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("overlap__in", ["", "skip", "bufferOne", "allowAll", "cancelOther"]),
                    ("overlap_state__in", ["", "buffered", "skipped", "superseded"]),
                    models.Q(
                        models.Q(("overlap_state__in", ["skipped", "superseded"]), _negated=True),
                        ("status", "Cancelled"),
                        _connector="OR",
                    ),
                ),
                name="service_calls_overlap_valid",
            ),
        ),
    ]
