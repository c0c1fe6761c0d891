"""The connections a worker process needs (docs/deploy.md, "Connections"): only the engine's loop
threads, its upkeep, the session heartbeat and django-q2's task thread use the database, never
the attempts' or the deliveries' threads, so WORKER_DB_POOL_SIZE's default is their count, and an
engine refuses a pool smaller than that."""

from __future__ import annotations

import threading

import pytest
from django.db.backends.signals import connection_created

from core.env import SettingsError
from delivery.models import Notification
from eventservice.database import ENGINE_DB_CONNECTIONS
from orchestration.models import ServiceCall
from tests.support.factories import make_call
from tests.support.subscriptions import make_subscription
from tests.support.waiting import wait_for
from workers.loops import BUILT_IN

CALLS = 12


def test_the_default_worker_pool_is_one_connection_per_engine_thread():
    # django-q2's task thread, the session heartbeat, the upkeep, and each built-in loop.
    assert 3 + len(BUILT_IN) == ENGINE_DB_CONNECTIONS


@pytest.fixture
def connecting_threads():
    """The names of the threads that took a database connection while the test ran."""
    names: set[str] = set()

    def note(sender, connection, **kwargs):
        names.add(threading.current_thread().name)

    connection_created.connect(note, dispatch_uid="test_engine_connections")
    yield names
    connection_created.disconnect(dispatch_uid="test_engine_connections")


@pytest.mark.also_postgres
def test_only_the_engines_own_threads_take_a_connection(connecting_threads, world, http_target, engine):
    make_subscription("acme", url=http_target.url("/echo/hook"))
    calls = [make_call("acme", url=http_target.url("/json"), due_in=0.2) for _ in range(CALLS)]
    wait_for(lambda: ServiceCall.objects.filter(pk__in=[c.pk for c in calls], status="Succeeded").count() == CALLS)
    # Each call's four events reach the subscription: the deliverer's tries ran too.
    wait_for(lambda: Notification.objects.filter(state="SUCCEEDED").count() == 4 * CALLS, timeout=20)
    assert http_target.count("/echo/hook") >= 4 * CALLS

    loops = {f"engine-{loop.name}" for loop in engine.loops.values()}
    # The test's own thread stands for django-q2's task thread (it opened the session too).
    allowed = loops | {"engine-upkeep", "session-heartbeat", "MainThread"}
    assert len(allowed) == engine.db_connections() == ENGINE_DB_CONNECTIONS
    assert connecting_threads <= allowed, connecting_threads - allowed
    assert {"engine-timer", "engine-recorder", "engine-dispatch", "engine-delivery"} <= connecting_threads


@pytest.mark.postgres
def test_an_engine_refuses_a_pool_smaller_than_its_threads(transactional_db, settings):
    from django.db import connections

    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    pool = connections.settings["default"]["OPTIONS"]["pool"]
    keeper = SessionKeeper()
    try:
        connections.settings["default"]["OPTIONS"]["pool"] = {**pool, "max_size": ENGINE_DB_CONNECTIONS - 1}
        with pytest.raises(SettingsError, match="raise WORKER_DB_POOL_SIZE"):
            Engine(keeper)
    finally:
        connections.settings["default"]["OPTIONS"]["pool"] = pool
        keeper.close()
