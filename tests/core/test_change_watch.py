"""core.db.ChangeWatch: a loop's idle read is skipped only while nothing has been committed
since a read that found nothing, and never longer than its recheck."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from core.db import ChangeWatch
from tenants.models import Tenant

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="PRAGMA data_version: SQLite's")


def _commit_in_another_thread() -> None:
    """A commit on another connection of this process, as another loop's or the web's."""

    def commit() -> None:
        try:
            Tenant.objects.create(id=f"t{time.monotonic_ns()}", name="other")
        finally:
            connection.close()

    thread = threading.Thread(target=commit)
    thread.start()
    thread.join(10)


def _reads(watch: ChangeWatch, found: bool = False) -> bool:
    """Whether the watch let the read run; the read finds `found`."""
    ran = []
    watch.read(lambda: ran.append(1) or found, empty=False)
    return bool(ran)


@pytest.mark.django_db(transaction=True)
def test_a_read_that_found_nothing_is_skipped_until_another_connection_commits():
    watch = ChangeWatch(recheck=60)
    assert _reads(watch)  # the first read always runs
    assert not _reads(watch) and not _reads(watch)  # nothing committed since: skipped
    _commit_in_another_thread()
    assert _reads(watch)  # seen at the next look
    assert not _reads(watch)


@pytest.mark.django_db(transaction=True)
def test_a_commit_while_the_read_runs_is_seen_by_the_next_look():
    watch = ChangeWatch(recheck=60)
    # The read finds nothing, but another connection commits while it runs (after the mark).
    watch.read(lambda: _commit_in_another_thread() or False, empty=False)
    assert _reads(watch)


@pytest.mark.django_db(transaction=True)
def test_a_read_that_found_something_is_never_skipped():
    watch = ChangeWatch(recheck=60)
    assert _reads(watch, found=True)
    assert _reads(watch, found=True)
    assert _reads(watch)  # found nothing now
    assert not _reads(watch)


@pytest.mark.django_db(transaction=True)
def test_the_recheck_bounds_how_long_reads_are_skipped():
    watch = ChangeWatch(recheck=0.2)
    assert _reads(watch)
    assert not _reads(watch)
    time.sleep(0.25)  # what falls due by the clock alone is looked for again
    assert _reads(watch)
    assert not _reads(watch)


@pytest.mark.django_db(transaction=True)
def test_forget_makes_the_next_read_run_and_own_commits_are_not_seen():
    watch = ChangeWatch(recheck=60)
    assert _reads(watch)
    Tenant.objects.create(id="own", name="own")  # this thread's own connection: not seen
    assert not _reads(watch)
    watch.forget()  # how a loop whose own write made work for it says so
    assert _reads(watch)


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_is_read_at_once():
    watch = ChangeWatch(recheck=60)
    assert _reads(watch)
    connection.close()  # as close_old_connections after an error
    assert _reads(watch)
