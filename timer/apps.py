from django.apps import AppConfig


class TimerConfig(AppConfig):
    name = "timer"
    verbose_name = "Timers"
