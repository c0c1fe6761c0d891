"""The SQLite backend waits for the write lock in fine steps, within its timeout."""

import sqlite3
import threading
import time

import pytest
from django.db import OperationalError, connection, transaction

from tenants.models import Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def hold_write_lock(seconds: float) -> threading.Thread:
    held = threading.Event()

    def hold():
        other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(5)
    return thread


@pytest.fixture(autouse=True)
def sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite backend only")


def test_a_writer_waits_while_another_holds_the_lock_and_then_commits():
    holder = hold_write_lock(0.3)
    started = time.monotonic()
    with transaction.atomic():
        Tenant.objects.create(id="waited", name="w")
    waited = time.monotonic() - started
    holder.join()
    assert waited >= 0.2  # it did wait for the other writer, and did not fail
    assert Tenant.objects.filter(id="waited").exists()
    with connection.cursor() as cursor:  # SQLite's own busy timeout is back for plain statements
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] == int(connection.settings_dict["OPTIONS"]["timeout"] * 1000)


def test_a_writer_gives_up_with_database_is_locked_after_its_timeout(monkeypatch):
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.2)
    holder = hold_write_lock(1.0)
    with pytest.raises(OperationalError, match="locked"), transaction.atomic():
        Tenant.objects.create(id="never", name="n")
    holder.join()
    assert not Tenant.objects.filter(id="never").exists()
