from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Workers"

    def ready(self) -> None:
        from workers import signals  # noqa: F401  (starts the engine inside qcluster workers)
