"""manage.py copy_to_postgres <url>: a stopped agent's data into an empty PostgreSQL database."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from eventservice.copying import CopyRefused, copy_all


class Command(BaseCommand):
    help = (
        "Copy this agent's data (tenants, users, keys, calls with their history, schedules, "
        "subscriptions, notifications) into an empty PostgreSQL database, then check the counts. "
        "Stop the agent first; the target is migrated, and refused if it holds any rows. Run it "
        "with the agent's own DATABASE_URL (the source) and its SECRET_KEY or FIELD_ENCRYPTION_KEYS, "
        "which the target agent needs as well (docs/deploy.md, Moving from SQLite to PostgreSQL)."
    )

    def add_arguments(self, parser):
        parser.add_argument("url", help="the target: postgres://user:password@host:5432/database")

    def handle(self, *args, url: str, **options):
        try:
            self.stdout.write("Copying into the target database (one transaction):")
            copied = copy_all(url, progress=self._progress)
        except CopyRefused as exc:
            raise CommandError(f"Nothing was copied: {exc}.") from None
        rows = sum(c.rows for c in copied)
        self.stdout.write(f"Copied {rows} rows in {len(copied)} tables; every count checked.")
        self.stdout.write(
            "Next: set DATABASE_URL to the target (keep SECRET_KEY and FIELD_ENCRYPTION_KEYS) and start the agent."
        )

    def _progress(self, copied) -> None:
        if copied.rows or copied.left:
            left = f" ({copied.left} grants of permissions this version no longer has left out)" if copied.left else ""
            self.stdout.write(f"  {copied.table}: {copied.rows}{left}")
