"""Settings for the test suite: the real stack, on a throwaway SQLite file by default."""

import os
import tempfile
from pathlib import Path

# Tests reach their own HTTP servers on loopback; egress tests narrow this again.
os.environ.setdefault("EGRESS_ALLOWLIST", "127.0.0.0/8,::1")
# One directory per test run, so runs side by side never share a database file.
os.environ.setdefault("DATA_DIR", tempfile.mkdtemp(prefix="service-agent-tests-"))
os.environ.setdefault("EVENT_LOG_LEVEL", "WARNING")
os.environ.setdefault("LOG_LEVEL", "WARNING")
# A fixed test key, in the environment so the qcluster and gunicorn processes that tests start
# (they read eventservice.settings) share it: secrets sealed here must open there.
os.environ.setdefault("SECRET_KEY", "test-only-service-agent-key-not-secret-0123456789abcdefghij")
# Tests submit, ping and retry faster than a fresh install's ceilings allow; the ceilings have
# their own tests (tests/tenants/test_ceilings_*.py), which set them per tenant or per test.
os.environ.setdefault("CEILING_SUBMISSIONS_PER_SECOND", "100000")
os.environ.setdefault("CEILING_TEST_PINGS_PER_MINUTE", "10000")
os.environ.setdefault("CEILING_MAX_ATTEMPTS", "20")
os.environ.setdefault("CEILING_MIN_BACKOFF_MS", "100")

from eventservice.settings import *  # noqa: E402,F403
from eventservice.settings import DATABASES  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# In-process tests start the engine themselves; qcluster tests turn it on in the subprocess.
ENGINE_ENABLED = False
WATCHDOG_GRACE_MS = 2000
if DATABASES["default"]["ENGINE"] in ("django.db.backends.sqlite3", "eventservice.sqlite"):
    DATABASES["default"]["TEST"] = {"NAME": str(Path(os.environ["DATA_DIR"]) / "test.db")}
else:
    # The test process's pool (not the environment's: the servers and clusters tests start keep
    # the defaults): an in-process engine's threads, the test's own and its helper threads.
    DATABASES["default"]["OPTIONS"]["pool"]["max_size"] = 40

# Serve static files straight from the app folders (no collectstatic before tests).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
STATIC_ROOT = Path(os.environ["DATA_DIR"]) / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# Tests revoke keys and expect the next request to be refused in the same process anyway;
# no cache keeps every test independent of the others' lookups.
API_KEY_CACHE_SECONDS = 0

# Many tests present bad API keys from 127.0.0.1 in one process; the limit has its own tests.
API_KEY_FAILURE_LIMIT = 1_000_000
