"""The system page: staff only; non-superuser staff see only their tenants' data."""

import time

import pytest

from tests.support.factories import make_call, make_failed_call, make_user
from timer.models import TimerSchedule
from workers.services import RunRecorder, session_start


@pytest.fixture
def superuser(db):
    return make_user("root", superuser=True)


def test_it_is_refused_to_users_who_are_not_staff(owner_client):
    assert owner_client.get("/system/").status_code == 403


def test_a_superuser_sees_workers_backlogs_and_every_tenants_failures(client, world, superuser):
    session = session_start()
    recorder = RunRecorder(session_id=session.id)
    recorder.record("dispatch", started=time.monotonic(), items=0, error=RuntimeError("sink down: broker refused"))
    recorder.flush(force=True)
    make_call("acme", name="later", due_in=600)
    make_failed_call("acme", name="acme failure")
    make_failed_call("globex", name="globex failure")
    client.force_login(superuser)
    response = client.get("/system/")
    assert response.status_code == 200
    html = response.content.decode()
    assert session.id in html
    assert response.context["timers"]["scheduled"] == TimerSchedule.objects.filter(state="Scheduled").count() == 3
    assert response.context["outbox"]["unpublished"] > 0
    assert "acme failure" in html and "globex failure" in html
    assert "sink down: broker refused" in html


def test_non_superuser_staff_see_only_their_tenants(client, world):
    make_call("acme", name="acme later", due_in=600)
    make_failed_call("acme", name="acme failure")
    make_failed_call("globex", name="globex failure")
    session = session_start()
    recorder = RunRecorder(session_id=session.id)
    recorder.record("dispatch", started=time.monotonic(), items=0, error=RuntimeError("mentions acme internals"))
    recorder.flush(force=True)
    client.force_login(world.staff_globex)
    response = client.get("/system/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "globex failure" in html
    assert "acme failure" not in html
    assert "mentions acme internals" not in html
    # Only globex's timer counts (the helpers leave timers Scheduled: no timer loop runs here).
    assert response.context["timers"]["scheduled"] == 1
    assert TimerSchedule.objects.filter(state="Scheduled").count() == 3
    assert [tenant.id for tenant, _ in response.context["tenant_counts"]] == ["globex"]


@pytest.mark.also_postgres
def test_it_names_the_database_and_nats_servers_the_agent_is_on(client, world, superuser, settings):
    # docs/deploy.md, "High availability".
    from django.db import connection

    settings.NATS_URL = "nats://agent:secret@nats1.internal:4222,nats://nats2.internal:4222"
    client.force_login(superuser)
    html = client.get("/system/").content.decode()
    if connection.vendor == "postgresql":
        info = connection.connection.info
        assert f'PostgreSQL at <span class="mono">{info.host}:{info.port}</span> · primary (takes writes)' in html
    else:
        assert "SQLite (a file of this host)" in html
    assert "nats://nats1.internal:4222" in html and "nats://nats2.internal:4222" in html
    assert "secret" not in html
