"""/api/tenants/{tenantId}/schedules (docs/schedules.md): create, list, get, change, pause,
resume, delete and the preview; bad input is a 400 with nothing stored."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from orchestration.models import ServiceCall
from schedules.models import Schedule
from tests.support.api import ApiClient, assert_problem
from tests.support.schedules import schedule_payload, schedule_url, schedules_url

pytestmark = pytest.mark.django_db


def stored() -> tuple[int, int]:
    return Schedule.objects.count(), ServiceCall.objects.count()


def create(api, **overrides) -> dict:
    response = api.post(schedules_url(), schedule_payload(**overrides))
    assert response.status_code == 201, response.content
    return response.json()


def test_it_creates_a_schedule_with_its_first_call_made_ahead(acme_api):
    response = acme_api.post(
        schedules_url(),
        schedule_payload(
            spec={"headers": {"Authorization": "Bearer sch-secret-1", "X-Job": "export"}},
            retryPolicy={"maxAttempts": 3},
        ),
    )

    assert response.status_code == 201, response.content
    body = response.json()
    assert response["Location"] == body["links"]["self"]
    assert body["cron"] == "30 2 * * *" and body["timezone"] == "Europe/Berlin"
    assert body["state"] == "active" and body["paused"] is False and body["skippedCount"] == 0
    assert body["requestSpec"]["headers"] == {"Authorization": "***", "X-Job": "export"}
    assert "sch-secret-1" not in response.content.decode()
    assert len(body["nextRuns"]) == 5
    assert all(run["local"].endswith(("+01:00", "+02:00")) and run["at"].endswith("Z") for run in body["nextRuns"])
    assert body["nextRun"] == body["nextRuns"][0]
    [call] = body["recentCalls"]
    assert call["status"] == "Scheduled" and call["scheduleId"] == body["scheduleId"]
    assert call["occurrenceAt"] == call["dueAt"] == body["nextRuns"][0]["at"]
    assert body["lastOccurrenceAt"] is None  # none has come yet: the call made ahead is the next run
    assert call["tags"] == ["nightly"] and call["name"] == "Nightly export"
    assert call["retryPolicy"]["maxAttempts"] == 3
    assert call["requestSpec"]["headers"]["Authorization"] == "***"
    # Stored sealed, as a call's secret header is.
    stored_call = ServiceCall.objects.get(pk=call["serviceCallId"])
    assert stored_call.request_spec["headers"]["Authorization"] != "Bearer sch-secret-1"


def test_a_paused_schedule_makes_no_call(acme_api):
    body = create(acme_api, paused=True)

    assert body["state"] == "paused" and body["nextRuns"] == [] and body["nextRun"] is None
    assert body["recentCalls"] == []
    assert ServiceCall.objects.count() == 0


def test_it_lists_newest_first_with_cursor_pages(acme_api):
    ids = [create(acme_api, name=f"s{n}")["scheduleId"] for n in range(3)]

    first = acme_api.get(schedules_url(), {"limit": 2}).json()
    second = acme_api.get(first["next"]).json()

    assert [row["scheduleId"] for row in first["results"]] == ids[::-1][:2]
    assert [row["scheduleId"] for row in second["results"]] == ids[:1]
    assert "nextRuns" not in first["results"][0] and first["results"][0]["nextRun"]


def test_get_shows_next_runs_and_recent_calls(acme_api):
    created = create(acme_api)

    shown = acme_api.get(created["links"]["self"]).json()

    assert shown["nextRuns"] == created["nextRuns"]
    assert [c["serviceCallId"] for c in shown["recentCalls"]] == [c["serviceCallId"] for c in created["recentCalls"]]


def test_pausing_cancels_the_call_made_ahead_and_resuming_plans_from_now(acme_api):
    created = create(acme_api, cron="*/5 * * * *", timezone="UTC")
    first_call = created["recentCalls"][0]

    paused = acme_api.patch(created["links"]["self"], {"paused": True}).json()

    assert paused["state"] == "paused" and paused["nextRuns"] == []
    assert ServiceCall.objects.get(pk=first_call["serviceCallId"]).status == "Cancelled"
    resumed = acme_api.patch(created["links"]["self"], {"paused": False}).json()
    assert resumed["state"] == "active"
    waiting = [c for c in resumed["recentCalls"] if c["status"] == "Scheduled"]
    assert len(waiting) == 1 and waiting[0]["occurrenceAt"] == resumed["nextRuns"][0]["at"]


def test_a_new_cron_cancels_the_call_made_ahead_and_makes_the_new_next_one(acme_api):
    created = create(acme_api, cron="0 3 * * *", timezone="UTC")

    changed = acme_api.patch(created["links"]["self"], {"cron": "15 4 * * *", "timezone": "Asia/Tokyo"}).json()

    assert changed["cron"] == "15 4 * * *" and changed["timezone"] == "Asia/Tokyo"
    statuses = {c["occurrenceAt"]: c["status"] for c in changed["recentCalls"]}
    assert statuses[created["nextRuns"][0]["at"]] == "Cancelled"
    assert statuses[changed["nextRuns"][0]["at"]] == "Scheduled"
    assert changed["nextRuns"][0]["local"].endswith("T04:15:00+09:00")


def test_a_new_end_that_keeps_the_next_run_keeps_its_call(acme_api):
    created = create(acme_api, cron="0 3 * * *", timezone="UTC")
    call_id = created["recentCalls"][0]["serviceCallId"]

    changed = acme_api.patch(created["links"]["self"], {"endAt": "2099-01-01T00:00:00Z", "name": "renamed"}).json()

    assert changed["endAt"] == "2099-01-01T00:00:00.000Z" and changed["name"] == "renamed"
    assert [c["serviceCallId"] for c in changed["recentCalls"]] == [call_id]
    assert ServiceCall.objects.get(pk=call_id).status == "Scheduled"


def test_delete_stops_future_occurrences_and_keeps_the_calls(acme_api):
    created = create(acme_api)
    call_id = created["recentCalls"][0]["serviceCallId"]

    response = acme_api.delete(created["links"]["self"])

    assert response.status_code == 204
    assert not Schedule.objects.exists()
    call = ServiceCall.objects.get(pk=call_id)
    assert call.status == "Cancelled" and str(call.schedule_id) == created["scheduleId"]
    assert_problem(acme_api.get(created["links"]["self"]), 404)


def test_the_preview_lists_the_next_runs_in_the_zone(acme_api):
    response = acme_api.get(schedules_url(suffix="/preview"), {"cron": "  30 2 * * *", "timezone": "America/New_York"})

    assert response.status_code == 200
    body = response.json()
    assert body["cron"] == "30 2 * * *" and body["timezone"] == "America/New_York"
    assert len(body["nextRuns"]) == 5
    assert all(run["local"][11:19] in ("02:30:00", "03:00:00") for run in body["nextRuns"])
    assert Schedule.objects.count() == 0


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"cron": "*/10 * * * * *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({}, "cron"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "timezone"),
    ],
)
def test_the_preview_says_why_it_refuses(acme_api, query, field):
    assert_problem(acme_api.get(schedules_url(suffix="/preview"), query), 400, errors_for=field)


BAD_INPUT = [
    ({"cron": "*/30 * * * * *"}, "cron"),
    ({"cron": "0 0 30 2 *"}, "cron"),
    ({"cron": "0 0 * 2 5#5"}, "cron"),
    ({"cron": "every day"}, "cron"),
    ({"timezone": "Europe/Atlantis"}, "timezone"),
    ({"timezone": "localtime"}, "timezone"),
    ({"startAt": "2030-01-02T00:00:00Z", "endAt": "2030-01-01T00:00:00Z"}, "endAt"),
    ({"endAt": "2020-01-01T00:00:00Z"}, "endAt"),
    ({"startAt": "2099-01-01T00:00:00Z"}, "startAt"),
    ({"startAt": "tomorrow"}, "startAt"),
    ({"endAt": "2099-01-01T00:00:00"}, "endAt"),
    ({"cron": "0 0 1 1 *", "timezone": "UTC", "endAt": "2099-01-01T00:00:00Z", "startAt": None}, None),
    ({"unexpected": 1}, "body"),
    ({"spec": {"url": "ftp://example.com/"}}, "requestSpec.url"),
    ({"spec": {"url": "http://10.0.0.1/"}}, "requestSpec.url"),
    ({"spec": {"method": "TRACE"}}, "requestSpec.method"),
    ({"spec": {"headers": {"Host": "x"}}}, "requestSpec.headers"),
    ({"tags": ["has space"]}, "tags"),
    ({"retryPolicy": {"maxAttempts": 99}}, "retryPolicy.maxAttempts"),
    ({"paused": "yes"}, "paused"),
    ({"name": ""}, "name"),
]


@pytest.mark.parametrize(("overrides", "field"), [case for case in BAD_INPUT if case[1]])
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_stored(acme_api, overrides, field):
    before = stored()

    response = acme_api.post(schedules_url(), schedule_payload(**overrides))

    assert_problem(response, 400, errors_for=field)
    assert stored() == before


def test_a_body_that_is_not_an_object_is_refused(acme_api):
    assert_problem(acme_api.post(schedules_url(), ["x"]), 400, errors_for="body")
    assert stored() == (0, 0)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "* * * * * *"}, "cron"),
        ({"timezone": "Nowhere/Else"}, "timezone"),
        ({"endAt": "2020-01-01T00:00:00Z"}, "endAt"),
        ({"startAt": "2030-06-01T00:00:00Z", "endAt": "2030-05-01T00:00:00Z"}, "endAt"),
        ({"kind": "x"}, "body"),
        ({"requestSpec": {"method": "GET"}}, "requestSpec.url"),
        ({"paused": None}, "paused"),
    ],
)
def test_a_bad_change_is_a_400_and_changes_nothing(acme_api, change, field):
    created = create(acme_api)
    before = list(Schedule.objects.values()), list(ServiceCall.objects.values_list("pk", "status"))

    assert_problem(acme_api.patch(created["links"]["self"], change), 400, errors_for=field)
    assert (list(Schedule.objects.values()), list(ServiceCall.objects.values_list("pk", "status"))) == before


def test_a_change_whose_window_holds_no_run_is_refused(acme_api):
    # 29 February: the next one is years away at most four; end the day before it.
    created = create(acme_api, cron="0 0 29 2 *", timezone="UTC")
    leap_day = datetime.fromisoformat(created["nextRuns"][0]["at"].replace("Z", "+00:00"))
    before = list(Schedule.objects.values()), list(ServiceCall.objects.values_list("pk", "status"))

    response = acme_api.patch(created["links"]["self"], {"endAt": (leap_day - timedelta(days=1)).isoformat()})

    body = assert_problem(response, 400, errors_for="endAt")
    assert "No occurrence" in body["errors"]["endAt"][0]
    assert (list(Schedule.objects.values()), list(ServiceCall.objects.values_list("pk", "status"))) == before


def test_a_tenant_has_at_most_max_schedules(acme_api, settings):
    settings.MAX_SCHEDULES_PER_TENANT = 2
    create(acme_api)
    create(acme_api)
    before = stored()

    assert_problem(acme_api.post(schedules_url(), schedule_payload()), 400, errors_for="body")
    assert stored() == before


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("get", "", None),
        ("patch", "", {"paused": True}),
        ("delete", "", None),
    ],
)
def test_another_tenants_schedule_is_404_on_every_route(acme_api, globex_api, method, suffix, body):
    created = create(acme_api)
    before = list(Schedule.objects.values()), list(ServiceCall.objects.values_list("pk", "status"))
    url = schedule_url(created["scheduleId"], tenant="globex", suffix=suffix)

    response = getattr(globex_api, method)(url, body) if body is not None else getattr(globex_api, method)(url)
    on_acme_path = getattr(globex_api, method)(created["links"]["self"], *([body] if body is not None else []))

    assert_problem(response, 404)
    assert_problem(on_acme_path, 404)
    assert (list(Schedule.objects.values()), list(ServiceCall.objects.values_list("pk", "status"))) == before
    assert globex_api.get(schedules_url("globex")).json()["results"] == []


@pytest.mark.parametrize("path", [schedules_url(), schedules_url(suffix="/preview?cron=0+9+*+*+*")])
def test_another_tenants_collection_and_preview_are_404(globex_api, path):
    assert_problem(globex_api.get(path), 404)
    assert_problem(globex_api.post(schedules_url(), schedule_payload()), 404)
    assert stored() == (0, 0)


def test_a_malformed_schedule_id_is_404(acme_api):
    assert_problem(acme_api.get(schedule_url("not-a-uuid")), 404)
    assert_problem(acme_api.patch(schedule_url("not-a-uuid"), {"paused": True}), 404)
    assert_problem(acme_api.delete(schedule_url("not-a-uuid")), 404)


def test_a_session_member_may_use_the_api_and_needs_csrf_to_write(world):
    from django.test import Client

    from tests.support.api import ApiClient

    client = Client(enforce_csrf_checks=True)
    client.force_login(world.member)
    api = ApiClient(None, client)
    assert api.get(schedules_url(suffix="/preview"), {"cron": "0 9 * * 1-5"}).status_code == 200
    assert_problem(api.post(schedules_url(), schedule_payload()), 403)
    assert stored() == (0, 0)
    client.cookies["csrftoken"] = "a" * 32
    assert api.post(schedules_url(), schedule_payload(), headers={"X-CSRFToken": "a" * 32}).status_code == 201


def test_last_occurrence_at_is_the_latest_that_came_not_the_one_made_ahead(world):
    from datetime import UTC

    from core.ids import iso_ms
    from schedules.making import make_occurrence_call
    from tests.support.schedules import make_schedule

    api = ApiClient(world.acme_key)
    schedule = make_schedule(cron="0 * * * *", timezone="UTC")
    past = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    make_occurrence_call(schedule, past, at_once=True)  # a backfilled occurrence, say
    for body in (
        api.get(f"/api/tenants/acme/schedules/{schedule.pk}").json(),
        api.get("/api/tenants/acme/schedules").json()["results"][0],
    ):
        assert body["lastOccurrenceAt"] == iso_ms(past)
        assert body["nextRun"]["at"] > iso_ms(datetime.now(UTC))
