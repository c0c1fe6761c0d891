"""django-q2's ORM broker, whose idle polls read the queue only after a commit.

The cluster's pusher asks the broker for tasks every `Q_CLUSTER["poll"]` (50 ms) and, on an
idle agent, finds none: each look is an ORM query, compiled again, which made the pusher the
busiest of the idle processes. New tasks arrive by commits (an `async_task` in a web process,
another worker's), so while nothing has been committed since a look that found none, the look
is skipped (core.db.ChangeWatch); a task whose lease ran out (django-q2's `retry`) falls due by
the clock, and a look is made at least every QUIET_RECHECK_SECONDS.
"""

from __future__ import annotations

from time import sleep

from django_q.brokers.orm import ORM
from django_q.conf import Conf

from core.db import ChangeWatch

QUIET_RECHECK_SECONDS = 1.0


class ORMBroker(ORM):
    def dequeue(self):
        # Not made in __init__: django-q2 also makes brokers by unpickling them.
        watch = self.__dict__.get("_watch")
        if watch is None:
            watch = self._watch = ChangeWatch(recheck=QUIET_RECHECK_SECONDS)
        mark = watch.mark()
        if mark is None:
            sleep(Conf.POLL)  # as the ORM broker does when it finds nothing
            return None
        tasks = super().dequeue()
        watch.done(mark, found=bool(tasks))
        return tasks
