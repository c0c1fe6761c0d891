"""The Schedules pages (docs/schedules.md): the list, the create page (with the preview shown
again when the form needs correcting), the detail page with its recent calls, and pause,
resume and delete (POSTs with the CSRF token). Another tenant's schedule is a 404 that
changes nothing."""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import Client

from orchestration.models import ServiceCall
from schedules.models import Schedule
from tests.support.schedules import calls_of, make_schedule

pytestmark = pytest.mark.django_db


def _form(**overrides) -> dict:
    data = {
        "name": "Nightly export",
        "cron": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "method": "POST",
        "url": "http://127.0.0.1:9/export",
        "header_name": ["X-Job", "Authorization"],
        "header_value": ["export", "Bearer page-secret-7"],
        "body_format": "json",
        "body": '{"full": true}',
        "tags": "nightly export",
        "start_local": "",
        "end_local": "",
    }
    data.update(overrides)
    return data


def test_the_list_shows_cron_zone_next_run_state_and_skipped(owner_client, world):
    make_schedule(name="Berlin nightly", cron="30 2 * * *", timezone="Europe/Berlin")
    make_schedule(name="Paused one", cron="0 9 * * 1-5", timezone="America/New_York", paused=True)
    make_schedule("globex", name="globex-only")

    page = owner_client.get("/schedules/")

    html = page.content.decode()
    assert page.status_code == 200
    assert "Berlin nightly" in html and "Paused one" in html and "globex-only" not in html
    assert re.search(r'data-local="\d{4}-\d\d-\d\dT02:30:00\+0[12]:00"', html)
    assert '<span class="badge badge-disabled">paused</span>' in html
    assert "America/New_York" in html


def test_creating_a_schedule_makes_its_first_call_and_shows_it(owner_client, world):
    response = owner_client.post("/schedules/new/", _form())

    schedule = Schedule.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/schedules/{schedule.pk}/"
    assert schedule.cron == "30 2 * * *" and schedule.timezone == "Europe/Berlin"
    assert schedule.tags == ["nightly", "export"] and schedule.request_spec["body"] == {"full": True}
    [call] = calls_of(schedule)
    assert call.status == ServiceCall.Status.SCHEDULED
    page = owner_client.get(response["Location"])
    html = page.content.decode()
    assert "page-secret-7" not in html and "***" in html
    assert html.count('data-local="') == 5 + 1  # the next runs, and the call's occurrence
    assert f'href="/calls/{call.pk}/"' in html


def test_start_and_end_are_read_in_the_schedules_zone(owner_client, world):
    berlin = ZoneInfo("Europe/Berlin")
    start = datetime.combine(date.today() + timedelta(days=30), time(0, 0))
    end = start + timedelta(days=20, hours=23, minutes=59)

    owner_client.post(
        "/schedules/new/",
        _form(start_local=start.isoformat(timespec="minutes"), end_local=end.isoformat(timespec="minutes")),
    )

    schedule = Schedule.objects.get()
    assert schedule.start_at == start.replace(tzinfo=berlin)  # midnight in Berlin, not in UTC
    assert schedule.end_at == end.replace(tzinfo=berlin)
    assert calls_of(schedule)[0].occurrence_at >= schedule.start_at


@pytest.mark.parametrize(
    ("overrides", "shown"),
    [
        ({"cron": "*/5 * * * * *"}, "intervals under a minute"),
        ({"cron": "0 0 30 2 *"}, "30 February"),
        ({"timezone": "Europe/Atlantis"}, "IANA time zone"),
        ({"url": "ftp://example.com/x"}, "http"),
        ({"body": "{not json"}, "not valid JSON"),
        ({"start_local": "2030-02-01T00:00", "end_local": "2030-01-01T00:00"}, "endAt must be after startAt"),
    ],
)
def test_a_form_that_needs_correcting_is_shown_again_and_nothing_is_stored(owner_client, world, overrides, shown):
    response = owner_client.post("/schedules/new/", _form(**overrides))

    assert response.status_code == 400
    assert shown in response.content.decode()
    assert (Schedule.objects.count(), ServiceCall.objects.count()) == (0, 0)
    assert "page-secret-7" not in response.content.decode()  # a secret is never echoed into the page


def test_the_page_shows_the_preview_without_javascript_when_shown_again(owner_client, world):
    response = owner_client.post("/schedules/new/", _form(name=""))

    html = response.content.decode()
    assert response.status_code == 400
    assert len(re.findall(r'<li data-local="\d{4}-\d\d-\d\dT0[23]:[03]0:00\+0[12]:00"', html)) == 5
    assert 'data-preview-url="/api/tenants/acme/schedules/preview"' in html


def test_pause_resume_and_delete_from_the_detail_page(owner_client, world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC")
    [first] = calls_of(schedule)

    paused = owner_client.post(f"/schedules/{schedule.pk}/paused", {"paused": "true"}, follow=True)
    assert "Schedule paused" in paused.content.decode()
    assert '<button type="submit" class="btn btn-primary">Resume</button>' in paused.content.decode()
    assert ServiceCall.objects.get(pk=first.pk).status == ServiceCall.Status.CANCELLED

    resumed = owner_client.post(f"/schedules/{schedule.pk}/paused", {"paused": "false"}, follow=True)
    assert "Schedule resumed" in resumed.content.decode()
    schedule.refresh_from_db()
    assert not schedule.paused and schedule.advance_at is not None

    confirm = owner_client.get(f"/schedules/{schedule.pk}/delete")
    assert confirm.status_code == 200 and "The calls it already made stay" in confirm.content.decode()
    assert Schedule.objects.filter(pk=schedule.pk).exists()
    deleted = owner_client.post(f"/schedules/{schedule.pk}/delete", follow=True)
    assert deleted.redirect_chain[-1][0] == "/schedules/"
    assert not Schedule.objects.filter(pk=schedule.pk).exists()
    assert ServiceCall.objects.filter(schedule_id=schedule.pk).count() == 2


def test_writes_need_the_csrf_token(world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC")
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.owner)

    assert client.post(f"/schedules/{schedule.pk}/paused", {"paused": "true"}).status_code == 403
    assert client.post(f"/schedules/{schedule.pk}/delete").status_code == 403
    assert client.post("/schedules/new/", _form()).status_code == 403
    schedule.refresh_from_db()
    assert not schedule.paused and Schedule.objects.count() == 1


def test_another_tenants_schedule_is_404_on_every_page(outsider_client, world):
    schedule = make_schedule(cron="0 * * * *", timezone="UTC", name="acme-private-schedule")
    before = list(Schedule.objects.values()), list(ServiceCall.objects.values_list("pk", "status"))

    for method, path, data in [
        ("get", f"/schedules/{schedule.pk}/", None),
        ("post", f"/schedules/{schedule.pk}/paused", {"paused": "true"}),
        ("get", f"/schedules/{schedule.pk}/delete", None),
        ("post", f"/schedules/{schedule.pk}/delete", {}),
    ]:
        response = getattr(outsider_client, method)(path, data) if data is not None else outsider_client.get(path)
        assert response.status_code == 404, path
        assert "acme-private-schedule" not in response.content.decode()
    assert "acme-private-schedule" not in outsider_client.get("/schedules/").content.decode()
    assert (list(Schedule.objects.values()), list(ServiceCall.objects.values_list("pk", "status"))) == before


def test_the_nav_links_the_schedules_page(owner_client, world):
    html = owner_client.get("/schedules/").content.decode()
    assert '<a href="/schedules/" aria-current="page">Schedules</a>' in html


def test_a_schedule_names_a_connection_and_an_unknown_one_is_said_beside_its_field(owner_client, world):
    from execution.connections import connection_create, validate_connection
    from schedules.models import Schedule

    data = {"name": "crm", "kind": "basic", "username": "agent", "password": "pw"}
    connection_create(tenant_id="acme", data=validate_connection(data))
    assert "connection-names" in owner_client.get("/schedules/new/").content.decode()
    refused = owner_client.post("/schedules/new/", _form(connection="nope"))
    assert refused.status_code == 400 and refused.context["form"].errors["connection"]
    owner_client.post("/schedules/new/", _form(connection="crm", header_name=["X-Job"], header_value=["export"]))
    assert Schedule.objects.get().request_spec["connection"] == "crm"
