"""django-q2's ORM broker, whose idle pusher sleeps until a task is queued.

The cluster's pusher asks the broker for tasks every `Q_CLUSTER["poll"]` (50 ms) and, on an
idle agent, finds none: each look is an ORM query (on PostgreSQL, a transaction), which made the
pusher the busiest of the idle processes. Tasks arrive by commits that wake the tasks channel
(`enqueue`; core/db/wakeups.py): while none has since a look that found
none, the look is skipped and the pusher sleeps until one does (core.db.ChangeWatch). A task
whose lease ran out (django-q2's `retry`) falls due by the clock: a look is made at least every
QUIET_RECHECK_SECONDS.
"""

from __future__ import annotations

from django_q.brokers.orm import ORM
from django_q.conf import Conf

from core.db import ChangeWatch
from core.db.wakeups import Channel, notify, wakeups

QUIET_RECHECK_SECONDS = 1.0
LISTENING_RECHECK_SECONDS = 5.0
# django-q2's pusher sees its stop signal between two looks: a look sleeps no longer than this.
LOOK_SLEEP_SECONDS = 0.5


class ORMBroker(ORM):
    def enqueue(self, task):
        queued = super().enqueue(task)
        notify(Channel.TASKS)  # the pusher sleeps until a task is queued
        return queued

    def dequeue(self):
        # Not made in __init__: django-q2 also makes brokers by unpickling them.
        watch = self.__dict__.get("_watch")
        if watch is None:
            wakeups.start()  # this process's listener (the pusher runs no engine)
            watch = self._watch = ChangeWatch(
                recheck=QUIET_RECHECK_SECONDS, channel=Channel.TASKS, listening_recheck=LISTENING_RECHECK_SECONDS
            )
        mark = watch.mark()
        if mark is None:
            watch.sleep(Conf.POLL, longest=LOOK_SLEEP_SECONDS)  # until a task is queued, or a while
            return None
        tasks = super().dequeue()
        watch.done(mark, found=bool(tasks))
        return tasks
