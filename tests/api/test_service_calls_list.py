"""GET /api/tenants/{tenantId}/service-calls: newest first, filters, cursor pagination."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from core.ids import iso_ms
from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall
from orchestration.services import service_call_finish, service_call_start
from tests.support.api import assert_problem, calls_url, submit_via_api


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [row["serviceCallId"] for row in response.json()["results"]]


def _run(call_id: str, *, outcome: Outcome | None) -> None:
    started = service_call_start(tenant_id="acme", service_call_id=uuid.UUID(call_id))
    assert started is not None
    if outcome is not None:
        assert service_call_finish(tenant_id="acme", service_call_id=started.service_call_id, outcome=outcome)


@pytest.fixture
def varied(acme_api, globex_api):
    """Five acme calls in four states with tags, and one globex call."""
    names = ["alpha report", "Beta REPORT", "gamma", "delta", "epsilon"]
    tags = [["red", "blue"], ["red"], ["blue"], ["red", "blue", "favorite"], []]
    calls = [
        submit_via_api(acme_api, name=name, tags=tag_list)["serviceCallId"]
        for name, tag_list in zip(names, tags, strict=True)
    ]
    _run(calls[1], outcome=None)  # Running
    _run(calls[2], outcome=Outcome(succeeded=True, status=200, latency_ms=3))
    _run(calls[3], outcome=Outcome.failure(ErrorKind.HTTP_ERROR, "503", status=503))
    submit_via_api(globex_api, "globex", name="alpha report", tags=["red", "blue"])
    return calls


def test_it_lists_the_tenants_calls_newest_first_without_other_tenants(acme_api, varied):
    response = acme_api.get(calls_url())

    assert _ids(response) == list(reversed(varied))
    body = response.json()
    assert body["next"] is None and body["previous"] is None
    assert {row["tenantId"] for row in body["results"]} == {"acme"}
    first = body["results"][0]
    assert first["name"] == "epsilon" and first["tags"] == [] and first["favorite"] is False
    assert "executions" not in first and "events" not in first


def test_status_filter_is_repeatable(acme_api, varied):
    assert _ids(acme_api.get(calls_url(), {"status": "Running"})) == [varied[1]]
    both = _ids(acme_api.get(calls_url(), {"status": ["Succeeded", "Failed"]}))
    assert both == [varied[3], varied[2]]
    statuses = set(ServiceCall.objects.filter(pk__in=both).values_list("status", flat=True))
    assert statuses == {"Succeeded", "Failed"}


def test_tag_filter_requires_every_tag(acme_api, varied):
    assert _ids(acme_api.get(calls_url(), {"tag": "red"})) == [varied[3], varied[1], varied[0]]
    assert _ids(acme_api.get(calls_url(), {"tag": ["red", "blue"]})) == [varied[3], varied[0]]
    assert _ids(acme_api.get(calls_url(), {"tag": ["red", "blue", "favorite"]})) == [varied[3]]
    assert _ids(acme_api.get(calls_url(), {"tag": "nope"})) == []


def test_q_matches_names_case_insensitively(acme_api, varied):
    assert _ids(acme_api.get(calls_url(), {"q": "report"})) == [varied[1], varied[0]]
    assert _ids(acme_api.get(calls_url(), {"q": "GAMM"})) == [varied[2]]


def test_favorite_filter_is_the_reserved_tag(acme_api, varied):
    response = acme_api.get(calls_url(), {"favorite": "true"})
    assert _ids(response) == [varied[3]]
    assert response.json()["results"][0]["favorite"] is True
    assert varied[3] not in _ids(acme_api.get(calls_url(), {"favorite": "false"}))
    assert len(_ids(acme_api.get(calls_url(), {"favorite": "false"}))) == 4


def test_filters_combine(acme_api, varied):
    assert _ids(acme_api.get(calls_url(), {"tag": "red", "status": "Scheduled", "q": "alpha"})) == [varied[0]]


def test_submitted_from_and_to_bound_the_submission_time(acme_api, world):
    early = submit_via_api(acme_api, name="early")
    time.sleep(0.01)
    boundary = datetime.now(UTC)
    time.sleep(0.01)
    late = submit_via_api(acme_api, name="late")

    assert _ids(acme_api.get(calls_url(), {"submittedFrom": iso_ms(boundary)})) == [late["serviceCallId"]]
    assert _ids(acme_api.get(calls_url(), {"submittedTo": iso_ms(boundary)})) == [early["serviceCallId"]]
    today = boundary.date().isoformat()
    assert len(_ids(acme_api.get(calls_url(), {"submittedFrom": today, "submittedTo": today}))) == 2
    tomorrow = (boundary + timedelta(days=1)).date().isoformat()
    assert _ids(acme_api.get(calls_url(), {"submittedFrom": tomorrow})) == []


def test_an_offset_in_a_filter_time_is_honoured_even_when_its_plus_is_unencoded(acme_api, world):
    call = submit_via_api(acme_api, name="x")
    submitted = ServiceCall.objects.get(pk=call["serviceCallId"]).submitted_at
    # The submission's UTC wall time read as +01:00 is an hour earlier; an unencoded '+'
    # arrives as a space.
    stamp = submitted.strftime("%Y-%m-%dT%H:%M:%S")
    url = calls_url() + f"?submittedFrom={stamp}+01:00"  # = submitted - 1h in UTC
    assert _ids(acme_api.get(url)) == [call["serviceCallId"]]
    url = calls_url() + f"?submittedTo={stamp}+01:00"
    assert _ids(acme_api.get(url)) == []


def test_due_from_and_to_bound_the_due_time(acme_api, world):
    now = datetime.now(UTC)
    soon = submit_via_api(acme_api, name="soon", dueAt=(now + timedelta(hours=1)).isoformat())
    later = submit_via_api(acme_api, name="later", dueAt=(now + timedelta(days=2)).isoformat())

    middle = iso_ms(now + timedelta(days=1))
    assert _ids(acme_api.get(calls_url(), {"dueFrom": middle})) == [later["serviceCallId"]]
    assert _ids(acme_api.get(calls_url(), {"dueTo": middle})) == [soon["serviceCallId"]]
    assert _ids(acme_api.get(calls_url(), {"dueFrom": iso_ms(now), "dueTo": middle})) == [soon["serviceCallId"]]


INVALID_FILTERS = [
    ({"status": "Pending"}, "status"),
    ({"tag": "two words"}, "tag"),
    ({"tag": "t" * 65}, "tag"),
    ({"submittedFrom": "yesterday"}, "submittedFrom"),
    ({"submittedTo": "2030-01-01T10:00:00"}, "submittedTo"),
    ({"dueFrom": "2030-13-01"}, "dueFrom"),
    ({"dueTo": "soon"}, "dueTo"),
    ({"favorite": "yes"}, "favorite"),
    ({"q": "x" * 201}, "q"),
    ({"limit": "0"}, "limit"),
    ({"limit": "201"}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"cursor": "not-a-cursor"}, "cursor"),
]


@pytest.mark.parametrize(("params", "field"), INVALID_FILTERS, ids=[f for _, f in INVALID_FILTERS])
def test_it_refuses_invalid_filter_values_with_400(acme_api, world, params, field):
    assert_problem(acme_api.get(calls_url(), params), 400, errors_for=field)


# --- Cursor pagination ------------------------------------------------------------------------


@pytest.fixture
def sixty(acme_api):
    return [submit_via_api(acme_api, name=f"call {i:02d}", tags=["bulk"])["serviceCallId"] for i in range(60)]


def test_next_and_previous_walk_the_whole_list_in_both_directions(acme_api, sixty):
    newest_first = list(reversed(sixty))
    page = acme_api.get(calls_url(), {"limit": 25}).json()
    seen = [row["serviceCallId"] for row in page["results"]]
    pages = [page]
    while page["next"]:
        assert page["next"].startswith("http://testserver/api/tenants/acme/service-calls?")
        page = acme_api.get(page["next"]).json()
        pages.append(page)
        seen += [row["serviceCallId"] for row in page["results"]]

    assert seen == newest_first
    assert [len(p["results"]) for p in pages] == [25, 25, 10]
    assert pages[0]["previous"] is None and pages[-1]["next"] is None

    back = acme_api.get(pages[-1]["previous"]).json()
    assert [row["serviceCallId"] for row in back["results"]] == newest_first[25:50]
    first = acme_api.get(back["previous"]).json()
    assert [row["serviceCallId"] for row in first["results"]] == newest_first[:25]
    assert first["previous"] is None
    assert first["next"] is not None


def test_the_cursor_keeps_the_filters_and_the_limit(acme_api, sixty):
    page = acme_api.get(calls_url(), {"limit": 7, "tag": "bulk", "q": "call"}).json()
    assert "tag=bulk" in page["next"] and "limit=7" in page["next"] and "q=call" in page["next"]
    second = acme_api.get(page["next"]).json()
    assert [row["serviceCallId"] for row in second["results"]] == list(reversed(sixty))[7:14]


def test_limit_defaults_to_25_and_allows_200(acme_api, sixty):
    assert len(acme_api.get(calls_url()).json()["results"]) == 25
    everything = acme_api.get(calls_url(), {"limit": 200}).json()
    assert len(everything["results"]) == 60 and everything["next"] is None
    assert len(acme_api.get(calls_url(), {"limit": 1}).json()["results"]) == 1


def test_a_page_beyond_new_submissions_stays_stable(acme_api, sixty):
    page = acme_api.get(calls_url(), {"limit": 25}).json()
    submit_via_api(acme_api, name="brand new")
    second = acme_api.get(page["next"]).json()
    assert [row["serviceCallId"] for row in second["results"]] == list(reversed(sixty))[25:50]


def test_a_page_costs_the_same_few_queries_however_many_calls_it_shows(acme_api, sixty, django_assert_max_num_queries):
    # The key lookup, the page, and the page's tags (prefetched): never one query per call.
    with django_assert_max_num_queries(4):
        response = acme_api.get(calls_url(), {"limit": 60, "tag": "bulk"})
    assert len(response.json()["results"]) == 60
