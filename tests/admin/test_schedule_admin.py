"""The admin of recurring schedules (docs/schedules.md): read-only rows with their next runs in
their zone and recent calls, secrets redacted, and the Pause and Resume actions, which go
through schedules.services; staff reach their own tenants' schedules only."""

from __future__ import annotations

from django.contrib.auth.models import Permission

from orchestration.models import ServiceCall
from schedules.models import Schedule
from tests.support.schedules import calls_of, make_schedule

CHANGELIST = "/admin/schedules/schedule/"


def _act(client, action: str, *schedules):
    return client.post(CHANGELIST, {"action": action, "_selected_action": [str(s.pk) for s in schedules]}, follow=True)


def test_its_page_shows_the_next_runs_in_its_zone_and_redacts_secrets(admin_client, world):
    schedule = make_schedule(
        name="nightly", cron="30 2 * * *", timezone="Europe/Berlin", headers={"Authorization": "Bearer adm-secret"}
    )

    page = admin_client.get(f"{CHANGELIST}{schedule.pk}/change/")

    html = page.content.decode()
    assert page.status_code == 200
    assert "T02:30:00+0" in html and "adm-secret" not in html and "***" in html
    assert f"/admin/orchestration/servicecall/{calls_of(schedule)[0].pk}/change/" in html
    assert 'name="_save"' not in html  # read-only
    assert admin_client.get(f"{CHANGELIST}add/").status_code == 403


def test_pause_and_resume_go_through_the_service(admin_client, world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC")
    [first] = calls_of(schedule)

    response = _act(admin_client, "pause", schedule)

    assert "Paused 1 schedule(s)" in response.content.decode()
    schedule.refresh_from_db()
    assert schedule.paused and schedule.advance_at is None
    assert ServiceCall.objects.get(pk=first.pk).status == ServiceCall.Status.CANCELLED

    response = _act(admin_client, "resume", schedule)
    assert "Resumed 1 schedule(s)" in response.content.decode()
    schedule.refresh_from_db()
    assert not schedule.paused and schedule.advance_at is not None


def test_staff_need_the_change_permission_and_reach_only_their_tenants(client, world):
    theirs = make_schedule("globex", name="theirs", cron="0 * * * *", timezone="UTC")
    other = make_schedule("acme", name="not theirs", cron="0 * * * *", timezone="UTC")
    staff = world.staff_globex
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="schedules", codename="view_schedule"))
    client.force_login(staff)

    page = client.get(CHANGELIST)
    assert "theirs" in page.content.decode() and "not theirs" not in page.content.decode()
    assert 'value="pause"' not in page.content.decode()
    _act(client, "pause", theirs)
    assert not Schedule.objects.get(pk=theirs.pk).paused

    staff.user_permissions.add(Permission.objects.get(content_type__app_label="schedules", codename="change_schedule"))
    _act(client, "pause", theirs, other)
    assert Schedule.objects.get(pk=theirs.pk).paused
    assert not Schedule.objects.get(pk=other.pk).paused
    assert client.get(f"{CHANGELIST}{other.pk}/change/").status_code in (302, 404)
