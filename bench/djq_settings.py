"""Settings of the django-q2 peer cluster: the project's, with django-q2's stock Q_CLUSTER.

Only the name (payloads are signed with it, so the bench process can enqueue), the ORM
broker on the same SQLite database and two workers (as the agent) are set; everything else
is django-q2's default (poll 0.2 s, guard cycle 0.5 s, save_limit 250, ...).
"""

from eventservice.settings import *  # noqa: F403
from eventservice.settings import Q_CLUSTER as _AGENT_Q_CLUSTER

Q_CLUSTER = {
    "name": _AGENT_Q_CLUSTER["name"],
    "orm": "default",
    "workers": 2,
}
ENGINE_ENABLED = False
