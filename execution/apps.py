from django.apps import AppConfig


class ExecutionConfig(AppConfig):
    name = "execution"
    verbose_name = "Execution"

    def ready(self) -> None:
        from execution import checks  # noqa: F401  (registers system checks)
