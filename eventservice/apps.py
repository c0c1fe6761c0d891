from django.apps import AppConfig


class EventServiceConfig(AppConfig):
    name = "eventservice"
    verbose_name = "Service Agent"

    def ready(self) -> None:
        from core.db import pool_install
        from eventservice import checks  # noqa: F401  (registers system checks)

        # Each process's connection pool on PostgreSQL: given back by a thread that ends holding
        # a connection, never shared with a forked process (docs/deploy.md, "Connections").
        pool_install()
        # The fan-out filters by a call's tags, which orchestration keeps (docs/events.md,
        # "Subscriptions filtered by tag"): delivery, beside orchestration, is handed the reader.
        from delivery.services.fanout import call_tags_reader_set
        from orchestration.selectors import call_tags_by_call

        call_tags_reader_set(call_tags_by_call)
        # A connection that a live call or a schedule names is not deleted (docs/connections.md):
        # execution, below both, is handed their readers.
        from execution.connections import USAGE_READERS
        from orchestration.selectors import calls_using_connection
        from schedules.selectors import schedules_using_connection

        USAGE_READERS[:] = [calls_using_connection, schedules_using_connection]
