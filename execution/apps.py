from django.apps import AppConfig


class ExecutionConfig(AppConfig):
    name = "execution"
    verbose_name = "Execution"
