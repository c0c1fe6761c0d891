"""The table of the `limits` cache (eventservice/settings.py CACHES): the request ceilings'
counts, shared by every web process (docs/flow-control.md, "Operator ceilings"). Made here so
a fresh database and the tests have it; with CACHE_URL (Redis) there is no table to make, and
scripts/start runs createcachetable anyway, for a switch from Redis back to the database."""

from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor) -> None:
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


def drop_cache_table(apps, schema_editor) -> None:
    schema_editor.execute("DROP TABLE IF EXISTS cache_limits")


class Migration(migrations.Migration):
    dependencies: list = []

    operations = [migrations.RunPython(create_cache_table, drop_cache_table)]
