"""The tenant tables are ready to be distributed by tenant (docs/scale.md, "The way past one
machine, on existing engines"): each has a `tenant_id` column and an index or unique constraint that leads with it,
in the database as the migrations made it."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection

pytestmark = [pytest.mark.also_postgres, pytest.mark.django_db]

# The tables docs/scale.md names as distributed by tenant_id, by model.
TENANT_TABLES = (
    "orchestration.ServiceCall",
    "orchestration.ServiceCallTag",
    "orchestration.FlowControl",
    "timer.TimerSchedule",
    "execution.HttpExecution",
    "outbox.OutboxEvent",
    "outbox.OutboxFeedCounter",
    "delivery.Notification",
    "schedules.Schedule",
    "tenants.TenantCeilings",
    "tenants.ApiKey",
    "tenants.Membership",
)


def _leads_with_tenant(table: str) -> list[str]:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return [
        name
        for name, c in constraints.items()
        if (c["index"] or c["unique"] or c["primary_key"]) and c["columns"][:1] == ["tenant_id"]
    ]


@pytest.mark.parametrize("label", TENANT_TABLES)
def test_each_tenant_table_has_tenant_id_and_an_index_leading_with_it(label):
    table = apps.get_model(label)._meta.db_table
    with connection.cursor() as cursor:
        columns = [column.name for column in connection.introspection.get_table_description(cursor, table)]
    assert "tenant_id" in columns, f"{table} has no tenant_id"
    assert _leads_with_tenant(table), f"{table} has no index or unique constraint leading with tenant_id"
