import os
import sys

from django.core.wsgi import get_wsgi_application

from core.env import SettingsError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventservice.settings")
try:
    application = get_wsgi_application()
except SettingsError as exc:
    # One line instead of a traceback. Exit status 4 is gunicorn's "App failed to load": its
    # arbiter stops rather than booting the worker again and again.
    print(f"Service Agent cannot start: {exc}", file=sys.stderr, flush=True)
    sys.exit(4)
