"""Admin of timers, the attempt log, worker sessions and loop runs: read-only, tenant-scoped."""

import time

import pytest

from execution.models import HttpExecution
from tests.support.factories import HOUR, make_call, make_succeeded_call
from timer.models import TimerSchedule
from workers.services import RunRecorder, session_start


@pytest.mark.parametrize(
    "path",
    [
        "/admin/timer/timerschedule/",
        "/admin/execution/httpexecution/",
        "/admin/workers/workersession/",
        "/admin/workers/looprun/",
        "/admin/",
    ],
)
def test_each_operations_page_renders(admin_client, world, path):
    make_succeeded_call("acme", name="done")
    session = session_start()
    recorder = RunRecorder(session_id=session.id)
    recorder.record("timer", started=time.monotonic(), items=3)
    recorder.flush(force=True)
    response = admin_client.get(path)
    assert response.status_code == 200


def test_timers_and_attempts_are_read_only(admin_client, world):
    call = make_succeeded_call("acme", name="done")
    timer = TimerSchedule.objects.get(service_call_id=call.pk)
    attempt = HttpExecution.objects.get(service_call_id=call.pk)
    assert admin_client.get("/admin/timer/timerschedule/add/").status_code == 403
    assert admin_client.post(f"/admin/timer/timerschedule/{timer.pk}/delete/", {"post": "yes"}).status_code == 403
    page = admin_client.get(f"/admin/execution/httpexecution/{attempt.pk}/change/").content.decode()
    assert 'name="_save"' not in page and "target-7" in page


def test_search_finds_a_calls_timer_and_attempt_by_the_call_id(admin_client, world):
    call = make_succeeded_call("acme", name="done")
    make_succeeded_call("acme", name="other")
    timers = admin_client.get(f"/admin/timer/timerschedule/?q={call.pk}").context["cl"].result_list
    attempts = admin_client.get(f"/admin/execution/httpexecution/?q={call.pk}").context["cl"].result_list
    assert [t.service_call_id for t in timers] == [call.pk]
    assert [a.service_call_id for a in attempts] == [call.pk]


def test_attempt_headers_are_shown_redacted(admin_client, world):
    call = make_succeeded_call("acme", name="secret", headers={"Authorization": "Bearer in-the-log"})
    attempt = HttpExecution.objects.get(service_call_id=call.pk)
    page = admin_client.get(f"/admin/execution/httpexecution/{attempt.pk}/change/").content.decode()
    assert "in-the-log" not in page and "***" in page


def test_non_superuser_staff_see_only_their_tenants_timers_and_attempts(staff_client, world):
    make_call("acme", name="acme later", due_in=HOUR)
    make_succeeded_call("acme", name="acme done")
    make_succeeded_call("globex", name="globex done")
    timers = staff_client.get("/admin/timer/timerschedule/").context["cl"].result_list
    attempts = staff_client.get("/admin/execution/httpexecution/").context["cl"].result_list
    assert {t.tenant_id for t in timers} == {"globex"}
    assert {a.tenant_id for a in attempts} == {"globex"}
