"""A worker process's session: created at start, beaten by a thread, closed on exit."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connection

from workers.services import session_beat, session_start, session_stop

logger = logging.getLogger("serviceagent.engine")


class SessionKeeper:
    def __init__(self) -> None:
        self.session_id = session_start().id
        self._beaten_at = time.monotonic()  # the last heartbeat written (or the start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="session-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(settings.WORKER_HEARTBEAT_SECONDS):
            # Taken before the heartbeat is written: the time stored is later, so the session
            # is never vouched for longer than a watchdog would wait (surely_alive).
            beating = time.monotonic()
            try:
                if not session_beat(session_id=self.session_id):
                    # Declared dead (stalled past WORKER_STALE_SECONDS): its attempts were
                    # interrupted by a watchdog; carry on under a new session.
                    logger.error("worker session %s was declared dead; starting a new one", self.session_id)
                    self.session_id = session_start().id
                self._beaten_at = beating
            except Exception:
                logger.exception("heartbeat failed")
                close_old_connections()
        connection.close()

    def surely_alive(self) -> str | None:
        """The session, while no watchdog can have declared it dead: its last heartbeat is less
        than half of WORKER_STALE_SECONDS old (a watchdog waits for all of it). None otherwise:
        work whose claims the watchdog gives back with a dead session's (event deliveries)
        must not start now."""
        if time.monotonic() - self._beaten_at < settings.WORKER_STALE_SECONDS / 2:
            return self.session_id
        return None

    def close(self, error: BaseException | None = None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            session_stop(session_id=self.session_id, error=error)
        finally:
            connection.close()
