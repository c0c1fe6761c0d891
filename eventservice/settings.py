"""Settings for Service Agent: every knob is an environment variable (see README)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from csp.constants import NONCE, NONE, SELF

from core.env import (
    SettingsError,
    env_bool,
    env_ceiling,
    env_choice,
    env_duration,
    env_durations,
    env_int,
    env_list,
    env_pair,
    env_str,
    served_base_url,
)
from delivery import nats_subjects
from eventservice.database import database_pooler, database_settings, worker_pool_size

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("DATA_DIR", str(BASE_DIR / "data")))

DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    """SECRET_KEY, else the key file scripts/start writes once, else (DEBUG only) a public dev key.

    Sessions, CSRF tokens, the idempotency fingerprint and, without FIELD_ENCRYPTION_KEYS, the
    key that seals secret header values all derive from it (docs/security.md#6-deployment-hardening),
    so a production start on a key printed in this file is refused.
    """
    key = env_str("SECRET_KEY", "").strip()
    if key:
        return key
    named = env_str("SECRET_KEY_FILE", "")
    path = Path(named) if named else DATA_DIR / "secret_key"
    if path.is_file():
        key = path.read_text().strip()
        if not key:
            raise SettingsError(f"the key file {path} is empty")
        return key
    if named:
        raise SettingsError(f"SECRET_KEY_FILE {path} does not exist")
    if DEBUG:
        # `manage.py check --deploy` warns about it (serviceagent.W001).
        return "dev-insecure-service-agent-key-public-in-the-source-never-use-in-production"
    raise SettingsError(
        f"SECRET_KEY is not set: set SECRET_KEY, or SECRET_KEY_FILE, or create {path} "
        "(scripts/start does), or DEBUG=true for a development key"
    )


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# Messages live in the session, which is server-side (the database), never in a cookie: the
# default cookie storage only signs, it does not encrypt, and some messages carry a secret shown
# once (a new API key, a webhook's signing secret).
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

# --- HTTPS (all off by default: `scripts/start` serves plain HTTP on 127.0.0.1) ---------------
# Behind a TLS-terminating proxy, turn these on; `manage.py check --deploy` is then clean
# (docs/security.md#6-deployment-hardening).
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Probes and scrapers often reach the process itself over plain HTTP; they carry no session.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# `HTTP_X_FORWARDED_PROTO,https`: trust the proxy's header for "this request came over HTTPS".
# Only set it when the proxy always sets (or strips) that header, or clients could forge it.
SECURE_PROXY_SSL_HEADER = env_pair("SECURE_PROXY_SSL_HEADER")
if SECURE_PROXY_SSL_HEADER and not SECURE_PROXY_SSL_HEADER[0].startswith("HTTP_"):
    raise SettingsError(
        "SECURE_PROXY_SSL_HEADER must name the header as Django sees it, e.g. HTTP_X_FORWARDED_PROTO,https"
    )

INSTALLED_APPS = [
    # Our apps first: `workers` hooks django-q2's cluster start.
    "tenants",
    "orchestration",
    "timer",
    "execution",
    "outbox",
    "delivery",
    "schedules",
    "workers",
    "eventservice",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI assets served locally (offline docs)
    "django_q",
    "axes",  # failed-login lockout (docs/security.md#6-deployment-hardening)
    "csp",
]

MIDDLEWARE = [
    "eventservice.middleware.CorrelationIdMiddleware",
    # A page that found no database connection free in time: 503 (docs/deploy.md, "Connections").
    "eventservice.middleware.DatabaseBusyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "eventservice.middleware.ContentSecurityPolicyMiddleware",  # django-csp, admin exception
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a lockout flagged during login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

# The pages load nothing from elsewhere and carry no inline script, style or handler, so the
# policy is strict. The nonce appears only in responses whose template asked for one (the API
# docs' Swagger UI bootstrap); every other page gets exactly the list below.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "object-src": [NONE],
        "base-uri": [NONE],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    },
}

ROOT_URLCONF = "eventservice.urls"
WSGI_APPLICATION = "eventservice.wsgi.application"

TEMPLATES = [
    {
        # Django's engine; its pages survive stored text no UTF-8 encoder takes (docs/security.md §1).
        "BACKEND": "core.rendering.DjangoTemplates",
        "NAME": "django",  # the alias Django's own engine has, which DRF looks up
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            "libraries": {"dashboard": "eventservice.dashboard.templatetags.dashboard"},
        },
    },
]

# --- Database (docs/deploy.md, "Connections") ----------------------------------------------
# The URL, SQLite's options, and on PostgreSQL each process's connection pool and the pooler in
# front (DATABASE_POOLER, DB_POOL_SIZE, DB_POOL_TIMEOUT_SECONDS): eventservice/database.py.
DATABASE_POOLER = database_pooler()
DATABASES = database_settings(DATA_DIR, pooler=DATABASE_POOLER)
# A direct connection to PostgreSQL for the wake-ups' LISTEN (core/db/wakeups.py), where
# DATABASE_URL goes through a pooler in transaction mode (docs/deploy.md, "Connections"); its
# database is DATABASE_URL's.
DATABASE_DIRECT_URL = env_str("DATABASE_DIRECT_URL", "")
# The loops' wake-ups (docs/architecture.md, "Wake, don't poll"); off, they poll.
WAKEUPS = env_bool("WAKEUPS", True)
if DATABASES["default"]["ENGINE"] == "eventservice.sqlite":
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test_event_service.db")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
AUTHENTICATION_BACKENDS = [
    # Refuses a locked-out username/address before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# After LOGIN_FAILURE_LIMIT failed logins of one username from one address, that pair is
# refused for LOGIN_COOLOFF_MINUTES. Counted in the database, so every web process agrees.
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True  # a throttle, not an audit trail of every login
AXES_LOCKOUT_CALLABLE = "eventservice.dashboard.views.accounts.login_locked_out"
AXES_CLIENT_IP_CALLABLE = "tenants.authentication.client_ip"
# How many proxies in front append to X-Forwarded-For: the client is the address the
# outermost one saw. 0 (direct exposure): the TCP peer, as a client cannot forge it.
TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0, minimum=0, maximum=10)
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
FORMAT_MODULE_PATH = ["eventservice.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT", "") or BASE_DIR / "staticfiles")
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves STATIC_ROOT once `collectstatic` has filled it (compressed copies included).
# Until then it serves the files straight from the app folders, so pages have their CSS under
# `manage.py runserver` or gunicorn whatever DEBUG says (outside DEBUG runserver serves none).
WHITENOISE_USE_FINDERS = not (STATIC_ROOT.is_dir() and any(STATIC_ROOT.iterdir()))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's, with the nesting limit and the rendering fallbacks of docs/security.md §1.
    "DEFAULT_RENDERER_CLASSES": ["eventservice.api.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["eventservice.api.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "eventservice.api.errors.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Service Agent API",
    "DESCRIPTION": "Define outgoing HTTP service calls, run them now or at a chosen time.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # /api/docs/ loads Swagger UI from our own static files, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Two enums of fields named "kind": an outcome's error kind and a connection's kind.
    "ENUM_NAME_OVERRIDES": {
        "ConnectionKindEnum": ["basic", "apiKeyHeader", "oauth2ClientCredentials"],
        "ErrorKindEnum": "execution.outcomes.ErrorKind",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "eventservice.api.schema.closed_request_bodies",
        "eventservice.api.schema.resources_and_links",
    ],
}
# /metrics without authentication (for a Prometheus scraper); false: staff sessions only.
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", True)
# Request bodies beyond this size are refused with 413 before parsing.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 512 * 1024, minimum=1024)

# Each process remembers a live API key this long (a revocation reaches other processes
# within it); 0 looks every key up on every request.
API_KEY_CACHE_SECONDS = env_int("API_KEY_CACHE_SECONDS", 5, minimum=0, maximum=300)
# After API_KEY_FAILURE_LIMIT failed Bearer authentications from one address within
# API_KEY_FAILURE_WINDOW_SECONDS, that address gets 429 for every key until the window ends.
# Counted in each process's memory (the `throttle` cache): docs/security.md#6-deployment-hardening.
API_KEY_FAILURE_LIMIT = env_int("API_KEY_FAILURE_LIMIT", 20, minimum=1)
API_KEY_FAILURE_WINDOW_SECONDS = env_int("API_KEY_FAILURE_WINDOW_SECONDS", 300, minimum=1, maximum=86_400)

# --- Operator ceilings per tenant (docs/flow-control.md, "Operator ceilings") ----------------------
# The defaults of every tenant the operator has not given its own (admin, manage.py
# set_tenant_ceilings); the bounds are tenants.ceilings.BOUNDS. Calls' parallelism and rate
# have no default ceiling (a call over a limit waits, and tenants share execution slots
# fairly): empty or `none` keeps it so. The others protect a fresh install and cannot be
# turned off, only raised.
CEILING_CALL_PARALLELISM = env_ceiling("CEILING_CALL_PARALLELISM", None, minimum=1, maximum=1000)
CEILING_CALL_RATE_PER_SECOND = env_ceiling(
    "CEILING_CALL_RATE_PER_SECOND", None, minimum=0.001, maximum=1000, integer=False
)
# Subscriptions a tenant may have (operator-wide ones are not counted): each one multiplies the
# tenant's events into notifications and deliveries.
MAX_SUBSCRIPTIONS_PER_TENANT = env_ceiling("MAX_SUBSCRIPTIONS_PER_TENANT", 50, minimum=1, maximum=10_000)
# Test pings (POST .../subscriptions/{id}/test) a tenant may send a minute: each is a request
# to an address the tenant chose.
CEILING_TEST_PINGS_PER_MINUTE = env_ceiling("CEILING_TEST_PINGS_PER_MINUTE", 10, minimum=1, maximum=10_000)
# Submissions (POST .../service-calls, .../rerun) a second per API key (per login for a session).
CEILING_SUBMISSIONS_PER_SECOND = env_ceiling("CEILING_SUBMISSIONS_PER_SECOND", 50, minimum=1, maximum=100_000)
# A call's retries: at most this many attempts, at least this long between two of them
# (a call's events reach every subscription once per attempt).
CEILING_MAX_ATTEMPTS = env_ceiling("CEILING_MAX_ATTEMPTS", 10, minimum=1, maximum=20)
CEILING_MIN_BACKOFF_MS = env_ceiling("CEILING_MIN_BACKOFF_MS", 1000, minimum=100, maximum=86_400_000)
# Where the request ceilings (submissions, test pings) are counted, so that they hold across web
# processes and hosts: the database (the `cache_limits` table, made by a migration) unless a
# Redis URL is given.
CACHE_URL = env_str("CACHE_URL", "").strip()
if CACHE_URL and not CACHE_URL.startswith(("redis://", "rediss://", "unix://")):
    raise SettingsError("CACHE_URL must be empty (the database) or a redis://, rediss:// or unix:// URL")

# Per-process memory: the API-key failure counts (tenants/authentication.py) need no shared
# store to bound guessing, and every Bearer request reads them, so a round trip would cost.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "throttle": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "throttle",
        "OPTIONS": {"MAX_ENTRIES": 10_000},
    },
    # Shared by every web process: the request ceilings (eventservice/api/throttles.py).
    "limits": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL, "KEY_PREFIX": "limits"}
        if CACHE_URL
        else {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "cache_limits",
            "OPTIONS": {"MAX_ENTRIES": 100_000},
        }
    ),
}

# --- The built-in mock target (/mock/) ----------------------------------------------------------
# Anonymous, on the same web server as the product: off, it answers 404 everywhere.
MOCK_TARGET_ENABLED = env_bool("MOCK_TARGET_ENABLED", True)
# Delayed mock answers each hold a web thread; at most this many per process at once (others
# get 503 at once), so they can never take every thread from the product's own pages. Keep it
# below the web server's threads per process (scripts/start: 8). 3 lets the demo's three
# delayed calls (seed_demo) run side by side.
MOCK_DELAY_CONCURRENCY = env_int("MOCK_DELAY_CONCURRENCY", 3, minimum=1, maximum=64)

# --- Domain ---------------------------------------------------------------------------------
EXECUTION_TIMEOUT_MS = env_int("EXECUTION_TIMEOUT_MS", 30_000, minimum=1, maximum=120_000)
# A Running call whose attempt outlived its timeout by this much is finished as Interrupted.
WATCHDOG_GRACE_MS = env_int("WATCHDOG_GRACE_MS", 15_000, minimum=0)
RESPONSE_BODY_SNIPPET_BYTES = env_int("RESPONSE_BODY_SNIPPET_BYTES", 4096, minimum=0)
RESPONSE_BODY_MAX_BYTES = env_int("RESPONSE_BODY_MAX_BYTES", 1024 * 1024, minimum=1024)
RESPONSE_MAX_HEADERS = env_int("RESPONSE_MAX_HEADERS", 100, minimum=1)
RESPONSE_MAX_HEADER_BYTES = env_int("RESPONSE_MAX_HEADER_BYTES", 64 * 1024, minimum=1024)
EGRESS_ALLOWLIST = env_list("EGRESS_ALLOWLIST", [])
# The built-in mock target lives on this server; its address is allowed by default. Unset, it is
# the loopback URL scripts/start serves this data directory at (DATA_DIR/agent_base_url), so a
# command from another shell judges the agent's own mock target as the agent's workers do.
AGENT_BASE_URL = (
    env_str("AGENT_BASE_URL", "") or served_base_url(DATA_DIR / "agent_base_url") or "http://127.0.0.1:8000"
)
if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", AGENT_BASE_URL):
    raise SettingsError(f"AGENT_BASE_URL must be an http:// or https:// URL, got {AGENT_BASE_URL!r}")
SECRET_HEADER_PATTERNS = env_list(
    "SECRET_HEADER_PATTERNS",
    ["authorization", "proxy-authorization", "cookie", "set-cookie", "token", "secret", "key", "password"],
)
# Fernet keys for secret header values at rest: first encrypts, all decrypt (rotation).
FIELD_ENCRYPTION_KEYS = env_list("FIELD_ENCRYPTION_KEYS", [])

# --- Workers --------------------------------------------------------------------------------
TIMER_POLL_INTERVAL_MS = env_int("TIMER_POLL_INTERVAL_MS", 20, minimum=1, maximum=60_000)
# Timers due within this horizon are held in the worker's in-memory heap.
TIMER_HORIZON_MS = env_int("TIMER_HORIZON_MS", 5_000, minimum=100)
TIMER_BATCH_SIZE = env_int("TIMER_BATCH_SIZE", 500, minimum=1)
# A call starts this (to twice this) before it is due, sent when due (docs/architecture.md).
TIMER_LEAD_MS = env_int("TIMER_LEAD_MS", 50, minimum=0, maximum=1000)
EXECUTION_CONCURRENCY = env_int("EXECUTION_CONCURRENCY", 48, minimum=1, maximum=1024)
# Threads of one worker process's pool that one tenant may hold (docs/flow-control.md, "Fair
# shares"): a tenant with slow targets always leaves the rest to the others. Default: three
# quarters of the pool.
EXECUTION_PER_TENANT = env_int(
    "EXECUTION_PER_TENANT", max(1, (3 * EXECUTION_CONCURRENCY + 3) // 4), minimum=1, maximum=EXECUTION_CONCURRENCY
)
OUTBOX_POLL_INTERVAL_MS = env_int("OUTBOX_POLL_INTERVAL_MS", 50, minimum=1)
OUTBOX_BATCH_SIZE = env_int("OUTBOX_BATCH_SIZE", 500, minimum=1)
WORKER_HEARTBEAT_SECONDS = env_int("WORKER_HEARTBEAT_SECONDS", 2, minimum=1)
# A worker session that has not beaten for this long is considered dead.
WORKER_STALE_SECONDS = env_int("WORKER_STALE_SECONDS", 10, minimum=2)
if 2 * WORKER_HEARTBEAT_SECONDS >= WORKER_STALE_SECONDS:
    # A worker starts event deliveries only while its last heartbeat is younger than half the
    # stale time (docs/events.md): with beats that far apart it would hardly ever deliver.
    raise SettingsError(
        f"WORKER_STALE_SECONDS ({WORKER_STALE_SECONDS}) must be more than twice WORKER_HEARTBEAT_SECONDS "
        f"({WORKER_HEARTBEAT_SECONDS})"
    )
RETENTION_DAYS = env_int("RETENTION_DAYS", 7, minimum=1)
# Published outbox events older than this are deleted by the retention loop; 0 keeps them.
OUTBOX_RETENTION_DAYS = env_int("OUTBOX_RETENTION_DAYS", 30, minimum=0)
ENGINE_ENABLED = env_bool("ENGINE_ENABLED", True)
# The connection pool of each qcluster worker process on PostgreSQL (the other processes':
# DB_POOL_SIZE): one for each engine thread that uses the database (eventservice/database.py).
WORKER_DB_POOL_SIZE = worker_pool_size(engine_enabled=ENGINE_ENABLED)

Q_BROKER = env_str("Q_BROKER", "orm")  # "orm" or a redis:// URL
Q_CLUSTER = {
    "name": env_str("Q_CLUSTER_NAME", "service-agent"),
    "workers": env_int("Q_WORKERS", 2, minimum=1),
    "recycle": 500,
    # Task timeouts stay generous: an attempt's own deadline bounds the HTTP work.
    "timeout": 300,
    "retry": 360,
    "max_attempts": 3,
    "ack_failures": True,
    "poll": 0.05,
    "guard_cycle": 0.5,
    "catch_up": False,
    # The product creates no django-q2 schedules (its timers are its own): a Schedule row,
    # however it got into the database, never runs a function (docs/security.md §5).
    "scheduler": False,
    "save_limit": 1000,
    "label": "Workers (django-q2)",
}
if Q_BROKER == "orm":
    Q_CLUSTER["orm"] = "default"
    # django-q2's ORM broker, whose idle polls skip the read while nothing was committed.
    Q_CLUSTER["broker_class"] = "workers.broker.ORMBroker"
elif Q_BROKER.startswith(("redis://", "rediss://")):
    Q_CLUSTER["redis"] = Q_BROKER
else:
    raise SettingsError("Q_BROKER must be 'orm' or a redis:// URL")

# --- Event sinks ----------------------------------------------------------------------------
# Where the outbox dispatcher publishes events (dotted paths of outbox.sinks.Sink classes); the
# log sink is always there (docs/architecture.md, "The path of one call").
OUTBOX_SINKS = ["outbox.sinks.LogSink", "delivery.fanout.NotificationSink"]

# --- Delivery to subscribers (docs/events.md) -----------------------------------------------
# Retry schedule after a failed try (each step ±10 % jitter); then, or past the expiry from the
# event, a notification is EXPIRED. A subscription failing that long without a success is
# disabled with a reason.
EVENT_DELIVERY_SCHEDULE = env_durations("EVENT_DELIVERY_SCHEDULE", "5s,5m,30m,2h,5h,10h,10h")
EVENT_DELIVERY_EXPIRY = env_duration("EVENT_DELIVERY_EXPIRY", "3d")
SUBSCRIPTION_DISABLE_AFTER = env_duration("SUBSCRIPTION_DISABLE_AFTER", "5d")
WEBHOOK_TIMEOUT_MS = env_int("WEBHOOK_TIMEOUT_MS", 15_000, minimum=100, maximum=120_000)
DELIVERY_CONCURRENCY = env_int("DELIVERY_CONCURRENCY", 64, minimum=1, maximum=256)
# Per worker process (each runs a delivery loop, docs/events.md): threads trying notifications,
# and tries one subscription may have out at once (a slow or dead receiver holds that many).
DELIVERY_PER_SUBSCRIPTION = env_int("DELIVERY_PER_SUBSCRIPTION", 16, minimum=1, maximum=256)
# ... and tries one tenant's subscriptions together may have out at once (docs/events.md, "Fair
# shares"): eight slow receivers of one tenant never hold every thread, and the rest is a reserve
# for the tenants holding few. Default: half of them (a quiet tenant's burst of events needs more
# of the reserve at once than a quiet tenant's calls do).
DELIVERY_PER_TENANT = env_int(
    "DELIVERY_PER_TENANT", max(1, (DELIVERY_CONCURRENCY + 1) // 2), minimum=1, maximum=DELIVERY_CONCURRENCY
)
# How many times as many are claimed ahead, so a try that comes back starts the next at once.
# Deeper claims deliver more of a burst while its calls still run, and take that CPU from them:
# 4 on SQLite, where a claim waits its turn for the one write lock; 2 on PostgreSQL, where it
# does not (with several clusters, 4 is better there too: docs/events.md). The lease grows with
# it (delivery.services.lease_length), so it must be the same on every host.
DELIVERY_CLAIM_AHEAD = env_int(
    "DELIVERY_CLAIM_AHEAD", 4 if DATABASES["default"]["ENGINE"] == "eventservice.sqlite" else 2, minimum=1, maximum=16
)
DELIVERY_POLL_INTERVAL_MS = env_int("DELIVERY_POLL_INTERVAL_MS", 50, minimum=1)
DELIVERY_BATCH_SIZE = env_int("DELIVERY_BATCH_SIZE", 100, minimum=1)
# Recurring schedules a tenant may have: each one makes a call per occurrence (docs/schedules.md).
MAX_SCHEDULES_PER_TENANT = env_int("MAX_SCHEDULES_PER_TENANT", 100, minimum=1)
# NATS JetStream: every event to the stream, ensured at start on its own subjects (docs/events.md, "NATS JetStream").
NATS_URL = env_str("NATS_URL", "").strip()
NATS_STREAM = env_str("NATS_STREAM", "SERVICEAGENT").strip()
if not re.fullmatch(r"[A-Za-z0-9_-]{1,255}", NATS_STREAM):
    raise SettingsError(f"NATS_STREAM must use only letters, digits, '-' and '_', got {NATS_STREAM!r}")
NATS_SUBJECT_TEMPLATE = env_str("NATS_SUBJECT_TEMPLATE", nats_subjects.DEFAULT_SUBJECT_TEMPLATE).strip()
NATS_STREAM_SUBJECTS = env_list("NATS_STREAM_SUBJECTS", list(nats_subjects.stream_subjects_of(NATS_SUBJECT_TEMPLATE)))
if problem := nats_subjects.validate_stream_subjects(NATS_STREAM_SUBJECTS):
    raise SettingsError(f"NATS_STREAM_SUBJECTS: {problem}")
if problem := nats_subjects.validate_subject_template(NATS_SUBJECT_TEMPLATE, stream_subjects=NATS_STREAM_SUBJECTS):
    raise SettingsError(f"NATS_SUBJECT_TEMPLATE: {problem}; got {NATS_SUBJECT_TEMPLATE!r}")
# The stream's copies on a NATS cluster's servers (docs/deploy.md, "High availability"): with 3,
# it takes messages while one server is lost.
NATS_STREAM_REPLICAS = env_int("NATS_STREAM_REPLICAS", 1, minimum=1, maximum=5)
NATS_PUBLISH_TIMEOUT_MS = env_int("NATS_PUBLISH_TIMEOUT_MS", 5_000, minimum=100, maximum=60_000)

# --- Logging --------------------------------------------------------------------------------
# One line per record on stderr, with tenantId, serviceCallId and correlationId wherever known:
# JSON for log collectors (the default), or text for a person at a terminal (scripts/start
# picks text when its output is one).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = env_choice("LOG_FORMAT", "json", ("json", "text"))
LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", LOG_LEVELS)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "core.logging.ContextFilter"}},
    "formatters": {
        "json": {"()": "core.logging.JsonFormatter"},
        "text": {"()": "core.logging.TextFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["context"]},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # django-q2 logs as "django-q" (conf.py), not under its package name.
        "django-q": {"level": env_choice("Q_LOG_LEVEL", "WARNING", LOG_LEVELS)},
        # django-axes: failed logins and lockouts are warnings; its INFO lines are start-up noise.
        "axes": {"level": "WARNING"},
        # The event sink logs every published event at INFO, four or more lines per call: off
        # unless asked for (EVENT_LOG_LEVEL=INFO). Subscribers and the events feed get them all.
        "serviceagent.events": {"level": env_choice("EVENT_LOG_LEVEL", "WARNING", LOG_LEVELS)},
    },
}
