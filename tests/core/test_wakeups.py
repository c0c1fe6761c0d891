"""core.db.wakeups: a commit that makes work wakes the loops waiting on its channel, in any
process; nothing else does (docs/architecture.md, "Wake, don't poll")."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from core.db import ChangeWatch
from core.db.wakeups import Channel, notify, wakeups
from tenants.models import Tenant

# On PostgreSQL notices wake the loops, on SQLite the database's own writes (inotify).
pytestmark = [pytest.mark.also_postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def listening(settings):
    settings.WAKEUPS = True
    wakeups.start()
    try:
        assert wakeups.listening
        yield wakeups
    finally:
        wakeups.stop()


def _in_another_thread(work) -> threading.Thread:
    """`work` on a connection of its own, as another process's loop or the web's."""

    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _woken(channel: Channel, seen: int, within: float) -> bool:
    return wakeups.wait(channel, seen=seen, timeout=within) != seen


def _make_work(channel: Channel, *, hold: float = 0.0, fail: bool = False) -> None:
    """A transaction that makes work for `channel`'s loops (a row, and its notice), held open
    `hold` seconds before it commits, or rolled back."""
    try:
        with transaction.atomic():
            Tenant.objects.create(id=f"t{time.monotonic_ns()}", name="work")
            notify(channel)
            time.sleep(hold)
            if fail:
                raise RuntimeError("rolled back")
    except RuntimeError:
        pass


def test_a_commit_that_makes_work_wakes_the_waiting_loop_once_it_commits(listening):
    seen = wakeups.seen_now(Channel.OUTBOX)
    thread = _in_another_thread(lambda: _make_work(Channel.OUTBOX, hold=0.5))
    try:
        # Still open: nothing to see yet.
        assert not _woken(Channel.OUTBOX, seen, within=0.3)
        assert _woken(Channel.OUTBOX, seen, within=5)
    finally:
        thread.join(10)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite's wake is any commit's, not a channel's")
def test_on_postgresql_a_rolled_back_transaction_or_another_channel_wakes_nobody(listening):
    seen = wakeups.seen_now(Channel.OUTBOX)
    _in_another_thread(lambda: _make_work(Channel.OUTBOX, fail=True)).join(10)
    _in_another_thread(lambda: _make_work(Channel.TIMER)).join(10)
    assert not _woken(Channel.OUTBOX, seen, within=0.5)
    assert wakeups.seen_now(Channel.TIMER) > 0


def test_a_watch_with_a_channel_skips_its_read_and_sleeps_until_the_channel_wakes(listening):
    watch = ChangeWatch(recheck=60, channel=Channel.DELIVERY)
    reads = []
    watch.read(lambda: reads.append(1), empty=None)
    watch.read(lambda: reads.append(1), empty=None)
    assert len(reads) == 1 and watch.waits_for_wake()
    thread = _in_another_thread(lambda: (time.sleep(0.3), _make_work(Channel.DELIVERY)))
    started = time.monotonic()
    watch.sleep(0.05)  # not a poll: until the wake
    slept = time.monotonic() - started
    thread.join(10)
    assert 0.25 <= slept < 10
    watch.read(lambda: reads.append(1), empty=None)
    assert len(reads) == 2


def test_a_loop_that_sleeps_again_without_looking_does_not_spin_on_the_wake_that_ended_its_sleep(listening):
    """The delivery loop of a process busy with calls may not claim: it sleeps step after step
    without a look. The wake that ended one of those sleeps must not end every later one (it spun,
    taking a core from the calls), nor may a wake after it be missed."""
    watch = ChangeWatch(recheck=60, channel=Channel.DELIVERY)
    watch.read(lambda: None, empty=None)
    time.sleep(0.25)  # a poll after the read: a wake may end the sleep at once
    wakeups.wake_here(Channel.DELIVERY)
    started = time.monotonic()
    watch.sleep(0.2)  # woken since its look: at once
    assert time.monotonic() - started < 0.15
    started = time.monotonic()
    watch.sleep(0.2)  # no look since: a poll's sleep, not another at once
    assert time.monotonic() - started >= 0.15
    threading.Timer(0.05, wakeups.wake_here, [Channel.DELIVERY]).start()
    started = time.monotonic()
    watch.sleep(0.4)  # a new wake ends it
    assert time.monotonic() - started < 0.3


def test_a_read_that_says_when_work_falls_due_is_made_then_without_a_wake(listening):
    watch = ChangeWatch(recheck=60, channel=Channel.SCHEDULES)
    watch.read(lambda: None, empty=None)
    watch.due_in(0.3)
    started = time.monotonic()
    watch.sleep(0.05)
    assert 0.25 <= time.monotonic() - started < 5
    assert not watch.waits_for_wake() or watch.seconds_quiet(0.05) == 0
    reads = []
    watch.read(lambda: reads.append(1), empty=None)
    assert reads == [1]


def test_a_wake_in_this_process_alone_needs_no_commit(listening):
    seen = wakeups.seen_now(Channel.BACKLOG)
    threading.Timer(0.1, wakeups.wake_here, [Channel.BACKLOG]).start()
    assert _woken(Channel.BACKLOG, seen, within=5)


def test_a_wake_of_every_process_without_a_commit_reaches_the_listener(listening):
    """Due calls a timer left to the backlog: no commit says so, a notice of its own does."""
    seen = wakeups.seen_now(Channel.BACKLOG)
    wakeups.wake_everywhere(Channel.BACKLOG)  # this process's loops at once ...
    assert wakeups.seen_now(Channel.BACKLOG) >= seen + 1
    deadline = time.monotonic() + 5  # ... and, through the listener, every process's
    while wakeups.seen_now(Channel.BACKLOG) < seen + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert wakeups.seen_now(Channel.BACKLOG) >= seen + 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the listener's own connection: PostgreSQL's")
def test_a_lost_listener_connection_means_every_read_is_made_until_it_listens_again(listening):
    watch = ChangeWatch(recheck=60, channel=Channel.FLOW)
    watch.read(lambda: None, empty=None)
    assert watch.mark() is None  # quiet, listening
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        assert cursor.fetchall(), "no listener connection found"
    deadline = time.monotonic() + 5
    while wakeups.listening and time.monotonic() < deadline:
        time.sleep(0.02)
    assert watch.mark() is not None  # not listening: the read is made
    deadline = time.monotonic() + 10
    while not wakeups.listening and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wakeups.listening
    seen = wakeups.seen_now(Channel.FLOW)
    _in_another_thread(lambda: _make_work(Channel.FLOW)).join(10)
    assert _woken(Channel.FLOW, seen, within=5)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="notices: PostgreSQL's")
def test_after_a_rolled_back_transaction_the_next_ones_notices_are_still_sent(listening):
    """A transaction's notices go with its commit: one rolled back drops its own, not the next
    transaction's on the same connection."""
    _make_work(Channel.OUTBOX, fail=True)
    seen = wakeups.seen_now(Channel.OUTBOX)
    _make_work(Channel.OUTBOX)
    assert _woken(Channel.OUTBOX, seen, within=5)
    # A savepoint rolled back after the transaction's first notice keeps that notice (a wake
    # too many costs a loop one read; one too few, a wait).
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            notify(Channel.DELIVERY)
            raise RuntimeError("the savepoint rolls back")
        notify(Channel.OUTBOX)
        seen = wakeups.seen_now(Channel.OUTBOX)
    assert _woken(Channel.OUTBOX, seen, within=5)
