from django.apps import AppConfig


class EventServiceConfig(AppConfig):
    name = "eventservice"
    verbose_name = "Service Agent"

    def ready(self) -> None:
        from eventservice import checks  # noqa: F401  (registers system checks)
