#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventservice.settings")
    from django.core.management import execute_from_command_line

    from core.env import SettingsError

    try:
        execute_from_command_line(sys.argv)
    except SettingsError as exc:
        # A missing or malformed environment variable: one line, not a traceback.
        sys.exit(f"Service Agent cannot start: {exc}")


if __name__ == "__main__":
    main()
