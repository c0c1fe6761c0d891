#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventservice.settings")
    from django.conf import settings
    from django.core.management import execute_from_command_line

    from core.env import SettingsError

    try:
        # Read the environment before any command: Django would let `help`, `shell` and others
        # run without settings (the mistake shown as a note, or not at all).
        settings.INSTALLED_APPS  # noqa: B018
        execute_from_command_line(sys.argv)
    except SettingsError as exc:
        # A missing or malformed environment variable: one line, not a traceback.
        sys.exit(f"Service Agent cannot start: {exc}")


if __name__ == "__main__":
    main()
