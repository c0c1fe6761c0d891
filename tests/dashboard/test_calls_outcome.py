"""The status page tells each call's outcome (HTTP status or error kind, and latency), and
filters by due date; the list stays cheap to read."""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from eventservice.dashboard.templatetags.dashboard import outcome
from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall
from tests.support.factories import HOUR, make_call, make_failed_call, make_finished_call, make_succeeded_call


def _cell(html: str, call) -> str:
    row = re.search(rf'<tr data-id="{call.pk}".*?</tr>', html, re.S)
    assert row, f"no row for {call.name}"
    cell = re.search(r'<td class="outcome-cell">(.*?)</td>', row.group(0), re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", cell.group(1))).strip()


def _names(response) -> list[str]:
    return [row["call"].name for row in response.context["rows"]]


def test_each_row_shows_the_http_status_or_error_kind_and_the_latency(owner_client, world):
    ok = make_succeeded_call("acme", name="ok")
    http_error = make_failed_call("acme", name="http error")
    timeout = make_finished_call(
        "acme", name="slow", outcome=Outcome.failure(ErrorKind.TIMEOUT, "No answer within 5000 ms.", latency_ms=5000)
    )
    denied = make_finished_call(
        "acme", name="denied", outcome=Outcome.failure(ErrorKind.EGRESS_DENIED, "10.0.0.1 is a private address.")
    )
    waiting = make_call("acme", name="waiting", due_in=HOUR)

    html = owner_client.get("/calls/").content.decode()

    assert '<th scope="col">Outcome</th>' in html
    assert _cell(html, ok) == "200 42 ms"
    assert _cell(html, http_error) == "HttpError 503 17 ms"
    assert _cell(html, timeout) == "Timeout 5.00 s"
    assert _cell(html, denied) == "EgressDenied"
    assert _cell(html, waiting) == "—"
    assert '<span class="outcome outcome-ok">200</span>' in html
    assert '<span class="outcome outcome-bad">HttpError 503</span>' in html


def test_a_call_waiting_for_its_next_attempt_shows_the_last_attempts_outcome():
    waiting = ServiceCall(status=ServiceCall.Status.SCHEDULED)
    waiting.outcome_kind, waiting.outcome_status, waiting.outcome_latency_ms = "HttpError", "502", "12"

    cell = re.sub(r"<[^>]+>", "", outcome(waiting))

    assert cell == "last try HttpError 502 12 ms"


def test_the_failed_filter_shows_why_each_call_failed(owner_client, world):
    make_succeeded_call("acme", name="fine")
    broken = make_failed_call("acme", name="broken")
    interrupted = make_finished_call(
        "acme", name="cut off", outcome=Outcome.failure(ErrorKind.INTERRUPTED, "The worker died.")
    )

    response = owner_client.get("/calls/?status=Failed")

    assert _names(response) == ["cut off", "broken"]
    html = response.content.decode()
    assert _cell(html, broken) == "HttpError 503 17 ms"
    assert _cell(html, interrupted) == "Interrupted"


def test_a_page_of_rows_reads_neither_requests_nor_stored_responses_and_costs_the_same_queries(owner_client, world):
    make_succeeded_call("acme", name="big answer", response_body="x" * 4000, body={"payload": "y" * 4000})
    owner_client.get("/calls/")  # the first visit also stores the current tenant in the session
    with CaptureQueriesContext(connection) as few:
        response = owner_client.get("/calls/")
    for row in response.context["rows"]:
        assert {"request_spec", "outcome_meta"} <= row["call"].get_deferred_fields()

    for number in range(10):
        make_failed_call("acme", name=f"failed {number}", tags=["bulk"])
    with CaptureQueriesContext(connection) as many:
        response = owner_client.get("/calls/")

    assert len(response.context["rows"]) == 11
    assert len(many.captured_queries) == len(few.captured_queries)
    page_queries = [q["sql"] for q in many.captured_queries if 'FROM "service_calls"' in q["sql"]]
    assert page_queries and not any('"service_calls"."request_spec"' in sql for sql in page_queries)


def test_the_live_feed_sends_the_outcome_cell_as_the_page_renders_it(owner_client, world):
    broken = make_failed_call("acme", name="broken")
    waiting = make_call("acme", name="waiting", due_in=HOUR)

    calls = owner_client.get(f"/calls/live?id={broken.pk}&id={waiting.pk}").json()["calls"]

    by_id = {item["serviceCallId"]: item for item in calls}
    page = owner_client.get("/calls/").content.decode()
    assert by_id[str(broken.pk)]["outcomeHtml"] in page
    assert "HttpError 503" in by_id[str(broken.pk)]["outcomeHtml"]
    assert by_id[str(waiting.pk)]["outcomeHtml"] == '<span class="muted">—</span>'


def _noon_in(days: int) -> datetime:
    return datetime.combine(datetime.now(UTC).date() + timedelta(days=days), time(12), tzinfo=UTC)


def test_it_filters_by_due_date_and_keeps_the_dates_in_the_form(owner_client, world):
    soon = _noon_in(2)
    later = _noon_in(5)
    make_call("acme", name="soon", due_at=soon)
    make_call("acme", name="later", due_at=later)

    assert _names(owner_client.get(f"/calls/?dueFrom={soon.date() + timedelta(days=1)}")) == ["later"]
    assert _names(owner_client.get(f"/calls/?dueTo={soon.date()}")) == ["soon"]
    response = owner_client.get(f"/calls/?dueFrom={soon.date()}&dueTo={later.date()}")
    assert _names(response) == ["later", "soon"]
    html = response.content.decode()
    assert f'name="dueFrom" value="{soon.date()}"' in html and f'name="dueTo" value="{later.date()}"' in html
    # A date-time with a zone works too, as on the API.
    assert _names(owner_client.get("/calls/", {"dueFrom": (soon + timedelta(hours=1)).isoformat()})) == ["later"]


def test_a_bad_due_date_is_a_form_error_named_by_its_label(owner_client, world):
    make_call("acme", name="anything", due_in=HOUR)

    for query in ("dueFrom=next-tuesday", "dueTo=2024-02-30", "dueFrom=2030-01-01T09:00:00"):
        response = owner_client.get(f"/calls/?{query}")
        assert response.status_code == 400, query
        assert _names(response) == []
        alert = re.search(
            r'<div class="form-errors" role="alert" id="filter-errors">(.*?)</div>\s*</form>',
            response.content.decode(),
            re.S,
        )
        assert alert, query
        text = alert.group(1)
        assert "<strong>Due from</strong>" in text or "<strong>Due to</strong>" in text
        assert "dueFrom" not in text and "dueTo" not in text


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("dueTo=9999-12-31", 200),  # the calendar's last day: everything is due before its end
        ("submittedTo=9999-12-31", 200),
        ("dueFrom=0001-01-01T00:00:00%2B01:00", 400),  # before the first representable instant
        ("submittedFrom=0001-01-01", 200),
    ],
)
def test_dates_at_the_calendars_edge_answer_not_crash(owner_client, world, query, status):
    from tests.support.api import ApiClient

    assert owner_client.get(f"/calls/?{query}").status_code == status
    assert ApiClient(world.acme_key).get(f"/api/tenants/acme/service-calls?{query}").status_code == status
