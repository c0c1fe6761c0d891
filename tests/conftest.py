"""Shared fixtures: two tenants with an owner, a member and an outsider; API keys; a real
HTTP target on 127.0.0.1; an in-process engine. Helpers are in tests/support/."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tenants.models import Membership
from tests.support.factories import make_api_key, make_member, make_tenant, make_user
from tests.support.nats import NATS_TEST_URL, jetstream_available, store_kept
from tests.support.targets import TargetServer, serving_target


@dataclass
class World:
    """Tenant `acme` (owner, member) and tenant `globex` (outsider), with one API key each."""

    acme: object
    globex: object
    owner: object
    member: object
    outsider: object
    staff_globex: object
    acme_key: str
    globex_key: str


@pytest.fixture
def world(db) -> World:
    acme = make_tenant("acme")
    globex = make_tenant("globex")
    owner = make_member("owner", "acme", role=Membership.Role.OWNER).user
    member = make_member("member", "acme").user
    outsider = make_member("outsider", "globex").user
    staff = make_user("staffglobex", password="pw-staff-123", is_staff=True)
    make_member("staffglobex", "globex")
    _, acme_key = make_api_key("acme")
    _, globex_key = make_api_key("globex")
    return World(acme, globex, owner, member, outsider, staff, acme_key, globex_key)


def _end_server_sessions_behind_pgbouncer(names: list[str]) -> None:
    """Behind PgBouncer, end its server connections to these databases: it keeps them idle, and
    PostgreSQL refuses to drop (or make again) a database someone is connected to."""
    from django.conf import settings
    from django.db import connection

    if settings.DATABASE_POOLER != "pgbouncer":
        return
    with connection._nodb_cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ANY(%s) AND pid <> pg_backend_pid()",
            [names],
        )


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, django_db_blocker):
    """The test databases' names (pytest-django's, one per xdist worker); behind PgBouncer, a
    database of that name left by an earlier run can be made again (docs/deploy.md,
    "Connections")."""
    from django.db import connections

    with django_db_blocker.unblock():
        _end_server_sessions_behind_pgbouncer([wrapper.creation._get_test_db_name() for wrapper in connections.all()])


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test databases; behind PgBouncer, ended before they are dropped."""
    yield
    from django.conf import settings
    from django.db import connections

    if settings.DATABASE_POOLER != "pgbouncer":
        return
    with django_db_blocker.unblock():
        names = [wrapper.settings_dict["NAME"] for wrapper in connections.all()]
        for wrapper in connections.all():
            wrapper.close()
            wrapper.close_pool()
        _end_server_sessions_behind_pgbouncer(names)


@pytest.fixture(autouse=True)
def _ceilings_read_afresh():
    """Each test reads the operator's ceilings as its own database holds them, not as the
    process's one-second copy left by the test before (tenants.selectors)."""
    from orchestration.admission import forget_limited_tenants
    from tenants.selectors import ceilings_forget

    ceilings_forget()
    forget_limited_tenants()  # which tenants have limits: the same one-second copy
    yield
    ceilings_forget()
    forget_limited_tenants()


@pytest.fixture(autouse=True)
def _signing_read_afresh():
    """Each test reads which tenants sign their calls from its own database, not from the
    process's one-second copy left by the test before (execution/signing.py); and the OAuth2
    tokens of its connections too (execution/credentials.py)."""
    from execution.credentials import tokens_forget
    from execution.signing import signing_forget

    signing_forget()
    tokens_forget()
    yield
    signing_forget()
    tokens_forget()


@pytest.fixture(autouse=True)
def _open_windows_looked_for_afresh():
    """Each test's loops look for the window of the open rows in its own database, not in the
    process's one-second copy left by the test before (core.partition_queries.OpenWindow; PostgreSQL)."""
    from tests.support.partitions import forget_windows

    forget_windows()
    yield


@pytest.fixture
def http_target() -> Iterator[TargetServer]:
    with serving_target() as server:
        yield server


@pytest.fixture
def engine(transactional_db):
    """The real engine (timer, execution pool, dispatcher, watchdog) in this process."""
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    keeper = SessionKeeper()
    running = Engine(keeper)
    running.start()
    yield running
    running.stop(drain_seconds=5)
    keeper.close()


def pytest_collection_modifyitems(config, items):
    """PostgreSQL-only tests skip on the SQLite pass with a clear reason (scripts/test runs them);
    NATS tests skip where no NATS with JetStream answers (.ci/run starts one when installed)."""
    from django.conf import settings

    on_postgres = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    skip_pg = pytest.mark.skip(
        reason="needs PostgreSQL: runs in the PostgreSQL pass of scripts/test (DATABASE_URL=postgres://...)"
    )
    for item in items:
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(skip_pg)

    nats_items = [item for item in items if item.get_closest_marker("nats")]
    if nats_items and not jetstream_available(NATS_TEST_URL):
        skip_nats = pytest.mark.skip(
            reason="needs NATS with JetStream at NATS_TEST_URL (default nats://127.0.0.1:4222)"
        )
        for item in nats_items:
            item.add_marker(skip_nats)


@pytest.fixture(scope="session", autouse=True)
def _nats_store_kept(request) -> Iterator[None]:
    """While a session runs NATS tests, a stream of its own keeps the server's store directory
    (tests/support/nats.py, `store_kept`): tests make and delete streams side by side."""
    if not any(item.get_closest_marker("nats") for item in request.session.items) or not jetstream_available():
        yield
        return
    with store_kept():
        yield


@pytest.fixture
def still_throttle_clock(monkeypatch):
    """The request ceilings' clock stands still (eventservice/api/throttles.py): a test's requests
    all fall in one window, however slow the machine is between them."""
    from eventservice.api.throttles import CeilingThrottle

    monkeypatch.setattr(CeilingThrottle, "timer", staticmethod(lambda: 1_000_000.0))
