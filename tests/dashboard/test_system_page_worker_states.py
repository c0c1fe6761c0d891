"""The system page's worker states: a clean stop reads "stopped", a session that stopped beating "unknown"."""

import re
from datetime import timedelta

import pytest

from core.ids import utcnow
from tests.support.factories import make_user
from workers.models import WorkerSession
from workers.services import session_start, session_stop, sessions_mark_stale


@pytest.fixture
def superuser_client(client, db):
    client.force_login(make_user("root", superuser=True))
    return client


def state_shown(html: str, session_id: str) -> str:
    row = re.search(rf"{re.escape(session_id)}</td>.*?</tr>", html, re.S).group(0)
    return re.search(r'class="wstatus wstatus-([a-z]+)">([a-z]+)</span>', row).groups()


def test_a_cleanly_stopped_session_is_shown_as_stopped_not_success(superuser_client):
    session = session_start()
    session_stop(session_id=session.id)
    assert WorkerSession.objects.get(id=session.id).status == WorkerSession.Status.SUCCESS
    html = superuser_client.get("/system/").content.decode()
    assert state_shown(html, session.id) == ("stopped", "stopped")
    assert ">success<" not in html


def test_a_session_that_stopped_beating_is_shown_as_unknown(superuser_client):
    session = session_start()
    WorkerSession.objects.filter(id=session.id).update(last_heartbeat_at=utcnow() - timedelta(hours=1))
    sessions_mark_stale()
    html = superuser_client.get("/system/").content.decode()
    assert state_shown(html, session.id) == ("unknown", "unknown")


def test_a_running_session_is_shown_as_running(superuser_client):
    session = session_start()
    html = superuser_client.get("/system/").content.decode()
    assert state_shown(html, session.id) == ("running", "running")
