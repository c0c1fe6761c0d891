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
