"""Wake-ups: the engine's loops sleep until a commit made work for them, or until work falls due
by the clock (docs/architecture.md, "Wake, don't poll").

Each loop waits on a channel (Channel). A transaction that makes work for a loop calls
`notify(channel)`:
- PostgreSQL: `pg_notify`, which the server sends when, and only if, the transaction commits, to
  every session LISTENing. Each process that waits (Wakeups.start) has one listener thread on a
  connection of its own: LISTEN needs a session that lives as long as the process, which a
  connection pooler in transaction mode (PgBouncer) does not keep, so it connects to
  DATABASE_DIRECT_URL when that is set (docs/deploy.md, "Connections").
- SQLite: nothing is sent; the database is a file of this host, and every commit writes its
  write-ahead log. Each process's listener thread waits on the kernel's inotify for writes to
  the database's files, whichever process made them, and then wakes every channel: a loop looks,
  and skips its read while its connection's `PRAGMA data_version` stands still
  (core.db.ChangeWatch). Without inotify (not Linux) the loops poll.
In both, after a wake the listener gathers what comes for WAKE_SPACING_SECONDS, and a woken loop
looks no more often than it polls (core.db.ChangeWatch.sleep): during a burst the loops look as
they polled, idle they sleep.
`wake_here` wakes a channel's loops of this process only (room freed in its pool, say), and
`wake_everywhere` those of every process when no commit does (on PostgreSQL a notice, on SQLite
a write to a wake file beside the database).

Every wake moves its channel's generation: a loop's ChangeWatch (core/db/watch.py) skips its
read while the generation stands still since a read that found nothing. While the listener is
not listening (not started, its connection lost, an in-memory database), `generation` is None:
every read is made, and waits are capped at FALLBACK_POLL_SECONDS.
"""

from __future__ import annotations

import enum
import logging
import os
import select
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction

try:  # Linux: the SQLite listener (requirements.txt)
    from inotify_simple import INotify
    from inotify_simple import flags as inotify_flags
except ImportError:
    INotify = inotify_flags = None

logger = logging.getLogger("serviceagent.wakeups")


class Channel(enum.StrEnum):
    """The channels, who notifies them and who waits on them."""

    # Timers registered or re-armed (timer/services.py): the timer loop.
    TIMER = "timer"
    # Due calls a timer left unstarted, its pool full (Engine.on_due): every backlog loop.
    BACKLOG = "backlog"
    # Calls held by flow control (orchestration/admission/): the flow loop.
    FLOW = "flow"
    # Events appended to the outbox (outbox/services.py): the dispatcher.
    OUTBOX = "outbox"
    # Notifications due now: made by the fan-out, resent, re-enabled (delivery/): every delivery
    # loop.
    DELIVERY = "delivery"
    # Schedules made, changed or resumed (schedules/services.py): the schedules loop.
    SCHEDULES = "schedules"
    # django-q2 tasks queued (the broker's enqueue): the cluster's pusher (workers/broker.py).
    TASKS = "tasks"


# PostgreSQL's channel names: one database may serve other software.
PREFIX = "service_agent_"
# The longest a wait lasts while the listener is not listening (every read is made then).
FALLBACK_POLL_SECONDS = 0.05
# Between two tries to connect the PostgreSQL listener.
RECONNECT_SECONDS = 1.0
# After a wake, the listener gathers what comes in this long before the next: during a burst
# the commits come hundreds a second, and a loop need not look more often than it used to poll.
WAKE_SPACING_SECONDS = 0.02
# The listener sleeps in select() on its connection and a pipe that `stop` writes to: nothing
# wakes it but a notice, its stop or a lost connection (psycopg's own `notifies(timeout=)` wakes
# ten times a second, which was most of an idle process's CPU). The kernel's TCP keepalives find a
# server that went away without a word (seconds: idle, between probes, probes).
LISTEN_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
# How long `start` waits for the listener's first try (a database that does not answer).
START_WAIT_SECONDS = 2.0


def notify(*channels: Channel) -> None:
    """Tell the loops of `channels`, in every process, that this transaction made work for them:
    once it commits (at once outside a transaction), never if it rolls back. Nothing to send on
    SQLite (the commit's own write wakes the listeners), nor with WAKEUPS off (nobody listens).

    On PostgreSQL the notice is a statement of its own right after the commit, all of one
    transaction's channels together: a transaction that NOTIFYs holds the server's notification
    queue lock through its commit, so the engine's write transactions, each notifying, would
    commit one at a time behind it; the notice alone writes nothing and holds it for no flush."""
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql" or not channels or not settings.WAKEUPS:
        return
    if not connection.in_atomic_block:
        _send(connection, channels)
        return
    # One notice for all of a transaction's channels: its callback, while still registered
    # (a rolled-back transaction or savepoint drops it, and its channels with it).
    pending = connection.__dict__.get("_wakeups_pending")
    if pending is None or all(entry[1] is not pending for entry in connection.run_on_commit):
        pending = connection._wakeups_pending = _Pending(connection)
        transaction.on_commit(pending)
    pending.channels.update(channels)


class _Pending:
    """The channels a transaction notifies, sent once it commits (its on_commit callback)."""

    def __init__(self, connection) -> None:
        self.connection = connection
        self.channels: set[Channel] = set()

    def __call__(self) -> None:
        _send(self.connection, self.channels)


def _send(connection, channels: Iterable[Channel]) -> None:
    channels = sorted(set(channels))
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT " + ", ".join(["pg_notify(%s, '')"] * len(channels)), [PREFIX + channel for channel in channels]
            )
    except Exception:  # committed all the same: the loops look by the clock
        logger.warning("a wake-up notice could not be sent", exc_info=True)


class Wakeups:
    """The wake-ups of one process: its listener thread and the channels' generations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # One condition per channel: a wake stirs that channel's sleepers only.
        self._changed = {channel: threading.Condition(self._lock) for channel in Channel}
        self._generations = dict.fromkeys(Channel, 0)
        self._users = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Written to by `stop`: it ends the listener's select().
        self._stop_pipe: tuple[int, int] | None = None
        # Set once the listener's first try to listen is over (listening or not).
        self._tried = threading.Event()
        self.listening = False

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Listen (idempotent; each start is matched by a stop). Not with WAKEUPS off, on an
        in-memory SQLite database (no other connection writes it), or on SQLite without inotify:
        the loops poll (core.db.ChangeWatch)."""
        with self._lock:
            self._users += 1
            if self._thread is not None or not settings.WAKEUPS:
                return
            connection = connections[DEFAULT_DB_ALIAS]
            if connection.vendor == "postgresql":
                listen = self._listen_postgres
            elif connection.vendor == "sqlite" and not connection.is_in_memory_db() and INotify is not None:
                listen = self._watch_sqlite
            else:
                return
            self._stop.clear()
            self._tried.clear()
            self._stop_pipe = os.pipe()
            self._thread = threading.Thread(target=listen, name="wakeups", daemon=True)
            self._thread.start()
        # The loops start listening, not polling: each skips its reads from its first look.
        self._tried.wait(START_WAIT_SECONDS)

    def stop(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users or self._thread is None:
                return
            thread, self._thread = self._thread, None
            self._stop.set()
            stop_pipe, self._stop_pipe = self._stop_pipe, None
        os.write(stop_pipe[1], b"x")
        thread.join(timeout=5)
        for end in stop_pipe:
            os.close(end)
        self._set_listening(False)

    # -- waking and waiting -------------------------------------------------------------------
    def generation(self, channel: Channel) -> int | None:
        """The channel's wake count; None while not listening (every read must be made)."""
        return self._generations[channel] if self.listening else None

    def wake_here(self, *channels: Channel) -> None:
        """Wake these channels' loops in this process."""
        with self._lock:
            for channel in channels:
                self._generations[channel] += 1
                self._changed[channel].notify_all()

    def wake_everywhere(self, channel: Channel) -> None:
        """Wake a channel's loops in every process when no commit does (due calls a timer left
        to the backlog): on PostgreSQL a notice of its own, on SQLite a write that the listeners
        see as they see a commit's."""
        self.wake_here(channel)
        connection = connections[DEFAULT_DB_ALIAS]
        if connection.vendor == "sqlite" and not connection.is_in_memory_db():
            if settings.WAKEUPS:  # off, nobody listens
                _wake_file(Path(connection.settings_dict["NAME"])).write_bytes(b"wake")
        else:
            notify(channel)

    def wait(self, channel: Channel, seen: int, timeout: float) -> int:
        """Sleep until `channel` wakes past `seen` (what the last call returned, or `seen_now`),
        or `timeout` seconds; returns its wake count now."""
        if not self.listening:
            timeout = min(timeout, FALLBACK_POLL_SECONDS)
        with self._lock:
            self._changed[channel].wait_for(lambda: self._generations[channel] != seen, timeout=max(0.0, timeout))
            return self._generations[channel]

    def seen_now(self, channel: Channel) -> int:
        with self._lock:
            return self._generations[channel]

    def _set_listening(self, listening: bool) -> None:
        self.listening = listening
        self._tried.set()
        if not listening:  # the loops asleep until a wake poll again (a look reads while not listening)
            self.wake_here(*Channel)

    # -- the listener threads -----------------------------------------------------------------
    def _listen_postgres(self) -> None:
        stop_read = self._stop_pipe[0]
        while not self._stop.is_set():
            try:
                with self._connect_postgres() as conn:
                    for channel in Channel:
                        conn.execute(f'LISTEN "{PREFIX}{channel}"')
                    self._set_listening(True)
                    while not self._stop.is_set():
                        readable, _, _ = select.select([conn.fileno(), stop_read], [], [])
                        if stop_read in readable:
                            break
                        # A lost connection raises here: readable, with no notice to read.
                        woken = {note.channel for note in conn.notifies(timeout=0)}
                        if not woken:
                            continue
                        self.wake_here(*(Channel(c.removeprefix(PREFIX)) for c in woken if c.startswith(PREFIX)))
                        time.sleep(WAKE_SPACING_SECONDS)
            except Exception:
                if not self._stop.is_set():
                    logger.warning("the wake-up listener lost its connection; retrying in %ss", RECONNECT_SECONDS)
            self._set_listening(False)
            self._stop.wait(RECONNECT_SECONDS)

    def _watch_sqlite(self) -> None:
        path = Path(connections[DEFAULT_DB_ALIAS].settings_dict["NAME"]).resolve()
        stop_read = self._stop_pipe[0]
        try:
            notifier = INotify()
            notifier.add_watch(path.parent, inotify_flags.MODIFY)
        except OSError:  # no inotify instance or watch left: the loops poll
            logger.warning("no inotify watch on %s: the loops poll", path.parent, exc_info=True)
            self._set_listening(False)
            return
        # A commit writes the write-ahead log (a checkpoint, the database file), and
        # wake_everywhere the wake file: the kernel says so at once, whichever process wrote.
        names = {path.name, f"{path.name}-wal", _wake_file(path).name}
        try:
            self._set_listening(True)
            while not self._stop.is_set():
                readable, _, _ = select.select([notifier.fileno(), stop_read], [], [])
                if stop_read in readable:
                    break
                if any(event.name in names for event in notifier.read(timeout=0)):
                    self.wake_here(*Channel)
                    time.sleep(WAKE_SPACING_SECONDS)
        finally:
            notifier.close()

    def _connect_postgres(self):
        import psycopg

        connection = connections[DEFAULT_DB_ALIAS]
        params = connection.get_connection_params()
        if settings.DATABASE_DIRECT_URL:
            # The server itself, past the pooler; the database is Django's (a test run's, say).
            return psycopg.connect(
                settings.DATABASE_DIRECT_URL, dbname=params["dbname"], autocommit=True, **LISTEN_KEEPALIVES
            )
        params.pop("cursor_factory", None)
        return psycopg.connect(**{**params, **LISTEN_KEEPALIVES}, autocommit=True)


def _wake_file(database: Path) -> Path:
    return database.with_name(f"{database.name}-wake")


# The process's wake-ups: the engine starts them (workers/engine.py), the pusher too
# (workers/broker.py).
wakeups = Wakeups()
