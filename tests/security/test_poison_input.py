"""Poison input: text no UTF-8 encoder (or PostgreSQL) takes, and JSON nested too deep.

Every edge refuses it with a 400 and stores nothing (docs/security.md §1); a row that holds it
anyway (stored before those rules, or by hand) is still shown by every API view, page and
admin page: rendered escaped or with U+FFFD, never a 500.
"""

from __future__ import annotations

import json
import logging

import pytest
from django.db import DataError, connection, transaction
from django.template import engines

from core.ids import utcnow
from core.logging import JsonFormatter
from core.rendering import CLIPPED, DjangoTemplates, clipped, display_json, json_response
from execution.models import HttpExecution
from orchestration.models import ServiceCall
from orchestration.validation import MAX_BODY_DEPTH, MAX_DOCUMENT_DEPTH
from outbox.models import OutboxEvent
from outbox.services import outbox_mark_published
from tests.commands.cli import call as run_command
from tests.support.api import ApiClient, assert_problem, call_url, calls_url, stored_counts, valid_payload
from tests.support.factories import make_succeeded_call
from timer.models import TimerSchedule

# About as deep as what the API stored before the nesting limit (its parser gave up near 950
# levels, depending on the stack under it).
OLD_API_DEPTH = 920


@pytest.fixture
def acme_api(world) -> ApiClient:
    return ApiClient(world.acme_key)


@pytest.fixture
def owner_client(client, world):
    client.force_login(world.owner)
    return client


def nested(depth: int, leaf: object = "x") -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def raw_document(depth: int) -> bytes:
    """A submission whose body is `depth` lists deep, as text (json.dumps itself would recurse)."""
    body = "[" * depth + "]" * depth
    return ('{"name":"deep","requestSpec":{"method":"POST","url":"http://127.0.0.1:9/","body":' + body + "}}").encode()


# --- the API refuses it, and stores nothing -----------------------------------------------

POISON_SUBMISSIONS = [
    pytest.param({"spec": {"body": {"k": "\ud800"}}}, "requestSpec.body", id="body-value"),
    pytest.param({"spec": {"body": {"\udc00": 1}}}, "requestSpec.body", id="body-key"),
    pytest.param({"spec": {"body": {"a": [1, {"b": ["\udbff"]}]}}}, "requestSpec.body", id="body-deep-in-lists"),
    pytest.param({"spec": {"body": {"a": {"b\ud83d": 1}}}}, "requestSpec.body", id="body-nested-key"),
    pytest.param({"spec": {"body": ["\ud800"]}}, "requestSpec.body", id="body-list"),
    pytest.param({"spec": {"body": "text \udfff"}}, "requestSpec.body", id="body-text"),
    pytest.param({"spec": {"body": {"k": "nul\u0000"}}}, "requestSpec.body", id="body-nul-value"),
    pytest.param({"spec": {"body": {"nul\u0000": 1}}}, "requestSpec.body", id="body-nul-key"),
    pytest.param({"spec": {"headers": {"X-Trace": "v\ud800"}}}, "requestSpec.headers", id="header-value"),
    pytest.param({"spec": {"headers": {"X-\ud800": "v"}}}, "requestSpec.headers", id="header-name"),
    pytest.param({"spec": {"url": "http://127.0.0.1:9/\ud800"}}, "requestSpec.url", id="url"),
    pytest.param({"spec": {"method": "GET\ud800"}}, "requestSpec.method", id="method"),
    pytest.param({"tags": ["ok", "bad\udc00"]}, "tags", id="tag"),
    pytest.param({"name": "name \ud800"}, "name", id="name"),
    pytest.param({"dueAt": "2030-01-01T00:00:00Z\ud800"}, "dueAt", id="due-at"),
    pytest.param({"idempotencyKey": "key-\ud800"}, "idempotencyKey", id="idempotency-key"),
]


@pytest.mark.parametrize(("overrides", "field"), POISON_SUBMISSIONS)
def test_the_api_refuses_text_it_cannot_store_at_any_depth_and_stores_nothing(acme_api, overrides, field):
    # json.dumps escapes the surrogate ("\ud800"): the bytes on the wire are valid JSON and ASCII.
    response = acme_api.post(calls_url(), valid_payload(**overrides))

    body = assert_problem(response, 400, errors_for=field)
    assert "lone UTF-16 surrogate" in body["errors"][field][0] or "NUL" in body["errors"][field][0]
    assert len(body["errors"]) == 1  # one message for the field, no cascade from its other checks
    assert stored_counts() == (0, 0, 0)


def test_the_message_names_where_in_the_body_the_bad_text_is(acme_api):
    response = acme_api.post(calls_url(), valid_payload(spec={"body": {"items": [{"id": 1}, {"name": "x\ud800"}]}}))

    body = assert_problem(response, 400, errors_for="requestSpec.body")
    assert body["errors"]["requestSpec.body"] == [
        "requestSpec.body.items[1].name contains a lone UTF-16 surrogate (U+D800): it is not valid Unicode text."
    ]


def test_an_unknown_field_named_with_bad_text_is_refused_without_echoing_it(acme_api):
    payload = valid_payload()
    payload["extra\ud800"] = 1

    body = assert_problem(acme_api.post(calls_url(), payload), 400, errors_for="body")
    assert body["errors"]["body"] == ["Unknown fields: extra\ufffd."]
    assert stored_counts() == (0, 0, 0)


def test_the_idempotency_key_header_is_checked_the_same_way(acme_api):
    response = acme_api.post(calls_url(), valid_payload(), headers={"Idempotency-Key": "key-\udc80"})

    body = assert_problem(response, 400, errors_for="idempotencyKey")
    assert "lone UTF-16 surrogate" in body["errors"]["idempotencyKey"][0]
    assert stored_counts() == (0, 0, 0)


def test_a_body_nested_to_the_limit_is_stored_and_one_level_more_is_refused(acme_api):
    assert acme_api.post(calls_url(), valid_payload(spec={"body": nested(MAX_BODY_DEPTH)})).status_code == 202

    response = acme_api.post(calls_url(), valid_payload(spec={"body": nested(MAX_BODY_DEPTH + 1)}))

    body = assert_problem(response, 400, errors_for="requestSpec.body")
    assert body["errors"]["requestSpec.body"] == [f"requestSpec.body is nested deeper than {MAX_BODY_DEPTH} levels."]
    assert ServiceCall.objects.count() == 1


@pytest.mark.parametrize("depth", [MAX_DOCUMENT_DEPTH, 2_000, 100_000])
def test_a_document_deeper_than_the_parser_allows_is_a_400_not_a_500(acme_api, depth):
    # 2,000 and 100,000 levels are deeper than Python's decoder can go (RecursionError).
    response = acme_api.post(calls_url(), raw=raw_document(depth))

    body = assert_problem(response, 400, errors_for="body")
    assert body["errors"]["body"] == [f"The request document is nested deeper than {MAX_DOCUMENT_DEPTH} levels."]
    assert stored_counts() == (0, 0, 0)


def test_tags_put_refuses_bad_text_and_deep_documents_and_changes_nothing(acme_api):
    call_id = acme_api.post(calls_url(), valid_payload()).json()["serviceCallId"]
    before = stored_counts()

    bad_tag = acme_api.put(call_url(call_id, suffix="/tags"), {"tags": ["ok", "bad\ud800"]})
    deep = acme_api.client.put(
        call_url(call_id, suffix="/tags"),
        '{"tags":' + "[" * 5000 + "]" * 5000 + "}",
        content_type="application/json",
        headers={"Authorization": f"Bearer {acme_api.key}"},
    )

    assert "lone UTF-16 surrogate" in assert_problem(bad_tag, 400, errors_for="tags")["errors"]["tags"][0]
    assert_problem(deep, 400, errors_for="body")
    assert stored_counts() == before
    assert sorted(ServiceCall.objects.get(pk=call_id).tag_rows.values_list("tag", flat=True)) == ["billing", "nightly"]


# --- the request page and the command refuse it too ---------------------------------------


def _form(**overrides):
    data = {
        "name": "Poison",
        "method": "POST",
        "url": "http://127.0.0.1:9/hook",
        "body_format": "json",
        "body": '{"ok": true}',
        "when": "now",
        "idempotency_key": "dashboard-poison-1",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"k": "\\ud800"}', "lone UTF-16 surrogate"),
        ('{"\\udc00": [1]}', "lone UTF-16 surrogate"),
        ('{"a": [{"b": "nul \\u0000"}]}', "NUL"),
        ("[" * (MAX_BODY_DEPTH + 1) + "]" * (MAX_BODY_DEPTH + 1), f"nested deeper than {MAX_BODY_DEPTH} levels"),
        ("[" * 5000 + "]" * 5000, f"nested deeper than {MAX_BODY_DEPTH} levels"),
    ],
    ids=["surrogate-value", "surrogate-key", "nul", "one-level-too-deep", "deeper-than-the-decoder"],
)
def test_the_request_page_refuses_it_in_the_json_body_editor(owner_client, body, message):
    response = owner_client.post("/calls/new/", _form(body=body))

    assert response.status_code == 400
    errors = response.context["form"].errors["body"]
    assert any(message in error for error in errors), errors
    assert stored_counts() == (0, 0, 0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--body", '{"k": "\\ud800"}', "--json-body"), "lone UTF-16 surrogate"),
        (("--body", "[" * 5000 + "]" * 5000, "--json-body"), f"nested deeper than {MAX_BODY_DEPTH} levels"),
        (("--body", "[" * 70 + "]" * 70, "--json-body"), f"nested deeper than {MAX_BODY_DEPTH} levels"),
        # What Python makes of a byte that is not UTF-8 in argv (surrogateescape).
        (("--body", "caf\udce9"), "lone UTF-16 surrogate"),
        (("--tag", "t\udce9"), "lone UTF-16 surrogate"),
    ],
    ids=["json-surrogate", "deeper-than-the-decoder", "one-level-too-deep", "text-body", "tag"],
)
def test_submit_call_refuses_it_and_stores_nothing(world, args, message):
    result = run_command(
        "submit_call", "--tenant", "acme", "--name", "Poison", "--method", "POST", "--url", "http://127.0.0.1:9/", *args
    )

    assert result.code != 0
    assert message in result.err
    assert stored_counts() == (0, 0, 0)


# --- a stored row holding it never makes a view fail ------------------------------------


@pytest.fixture
def poisoned_call(world) -> ServiceCall:
    """A call run through the real services, then given what validation refuses today by
    writing the JSON columns directly (as a row stored before the rules would hold it)."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's jsonb refuses lone surrogates and NUL: no such row can exist there")
    call = make_succeeded_call("acme", name="poisoned", headers={"X-Trace": "t-1"}, response_body={"ok": True})
    spec = dict(call.request_spec)
    spec["headers"] = {**spec["headers"], "X-Poison\udc00": "v\ud800"}
    spec["body"] = {"k\ud800": ["\udc00", {"n": "nul\u0000"}], "deep": nested(OLD_API_DEPTH)}
    meta = call.outcome_meta
    meta["responseMeta"]["headers"] = {"X-Reply": "h\udfff"}
    meta["responseMeta"]["bodySnippet"] = "snippet \ud800"
    ServiceCall.objects.filter(pk=call.pk).update(request_spec=spec, outcome_meta=meta)
    ServiceCall.objects.filter(pk=call.pk).update(name="nul \u0000 in the name")
    HttpExecution.objects.filter(service_call_id=call.pk).update(
        request_headers={"X-Poison": "\ud800"}, response_headers={"X-Reply": "\udc00"}
    )
    for event in OutboxEvent.objects.filter(aggregate_id=call.pk):
        envelope = event.event_payload
        envelope["payload"] = {
            **envelope["payload"],
            "name": "n\ud800",
            "tags": ["t\udc00"],
            "deep": nested(OLD_API_DEPTH),
        }
        OutboxEvent.objects.filter(pk=event.pk).update(event_payload=envelope)
    # Published: the events feed shows them.
    with transaction.atomic():
        outbox_mark_published(
            ids=list(OutboxEvent.objects.filter(aggregate_id=call.pk).values_list("pk", flat=True)), at=utcnow()
        )
    return ServiceCall.objects.get(pk=call.pk)


def _ok(response, status: int = 200) -> str:
    assert response.status_code == status, response.content[:500]
    return response.content.decode("utf-8")  # strict: the page or document is valid UTF-8


def test_text_columns_cannot_hold_a_lone_surrogate_so_json_columns_are_where_it_can_live(world):
    call = make_succeeded_call("acme", name="plain")
    # SQLite's and PostgreSQL's drivers both encode text as strict UTF-8.
    with pytest.raises((UnicodeEncodeError, DataError)), transaction.atomic():
        ServiceCall.objects.filter(pk=call.pk).update(name="x\ud800")


@pytest.mark.postgres
@pytest.mark.parametrize("body", [{"k": "\ud800"}, {"\udc00": 1}, {"k": "nul \u0000"}])
def test_postgresql_cannot_store_what_validation_refuses_so_both_backends_answer_400(world, body):
    # Without the check the submission would be stored on SQLite and a 500 on PostgreSQL.
    call = make_succeeded_call("acme", name="plain")
    with pytest.raises(DataError), transaction.atomic():
        ServiceCall.objects.filter(pk=call.pk).update(request_spec={**call.request_spec, "body": body})


def test_the_api_shows_a_poisoned_call_escaped_in_every_view(acme_api, poisoned_call):
    call_id = str(poisoned_call.pk)

    listed = json.loads(_ok(acme_api.get(calls_url())))
    detail = json.loads(_ok(acme_api.get(call_url(call_id))))
    feed = json.loads(_ok(acme_api.get("/api/tenants/acme/events")))
    tagged = json.loads(_ok(acme_api.put(call_url(call_id, suffix="/tags"), {"tags": ["after"]})))

    # JSON escapes a lone surrogate ("\ud800"): nothing is lost, and the bytes are valid UTF-8.
    assert listed["results"][0]["requestSpec"]["headers"]["X-Poison\udc00"] == "v\ud800"
    assert "k\ud800" in detail["requestSpec"]["body"]
    assert detail["outcome"]["responseMeta"]["bodySnippet"] == "snippet \ud800"
    assert detail["executions"][0]["response"]["headers"] == {"X-Reply": "\udc00"}
    assert {event["payload"].get("name") for event in feed["data"]} >= {"n\ud800"}
    assert tagged["tags"] == ["after"]


def test_running_a_poisoned_call_again_is_refused_and_stores_nothing(acme_api, owner_client, poisoned_call):
    before = stored_counts()

    response = acme_api.post(call_url(poisoned_call.pk, suffix="/rerun"))
    page = owner_client.post(f"/calls/{poisoned_call.pk}/rerun", follow=True)

    body = assert_problem(response, 400, errors_for="requestSpec.headers")
    assert "requestSpec.body" in body["errors"]
    assert page.status_code == 200
    assert "lone UTF-16 surrogate" in page.content.decode()
    assert stored_counts() == before


def test_a_call_stored_with_a_body_beyond_the_limit_is_shown_but_not_run_again(acme_api, world):
    call = make_succeeded_call("acme", name="deep", response_body=None)
    spec = {**call.request_spec, "body": nested(OLD_API_DEPTH)}
    ServiceCall.objects.filter(pk=call.pk).update(request_spec=spec)

    _ok(acme_api.get(call_url(call.pk)))
    response = acme_api.post(call_url(call.pk, suffix="/rerun"))

    body = assert_problem(response, 400, errors_for="requestSpec.body")
    assert body["errors"]["requestSpec.body"] == [f"requestSpec.body is nested deeper than {MAX_BODY_DEPTH} levels."]


def test_the_dashboard_shows_a_poisoned_call_with_replacement_characters(owner_client, poisoned_call):
    call_id = poisoned_call.pk

    listing = _ok(owner_client.get("/calls/"))
    details = _ok(owner_client.get(f"/calls/{call_id}/"))
    live = json.loads(_ok(owner_client.get(f"/calls/{call_id}/live")))
    statuses = json.loads(_ok(owner_client.get(f"/calls/live?id={call_id}")))

    assert str(call_id)[:8] in listing
    assert "k\ufffd" in details and "snippet \ufffd" in details
    assert live["requestSpec"]["headers"]["X-Poison\udc00"] == "v\ud800"
    assert statuses["calls"][0]["status"] == "Succeeded"


def test_the_admin_shows_a_poisoned_call_in_every_list_and_change_page(admin_client, poisoned_call):
    execution = HttpExecution.objects.get(service_call_id=poisoned_call.pk)
    event = OutboxEvent.objects.filter(aggregate_id=poisoned_call.pk).first()
    timer = TimerSchedule.objects.get(service_call_id=poisoned_call.pk)

    for url in (
        "/admin/orchestration/servicecall/",
        f"/admin/orchestration/servicecall/{poisoned_call.pk}/change/",
        "/admin/execution/httpexecution/",
        f"/admin/execution/httpexecution/{execution.pk}/change/",
        "/admin/outbox/outboxevent/",
        f"/admin/outbox/outboxevent/{event.pk}/change/",
        "/admin/timer/timerschedule/",
        f"/admin/timer/timerschedule/{timer.pk}/change/",
    ):
        _ok(admin_client.get(url))


def test_a_hostile_targets_answer_shows_on_the_details_page(owner_client, world):
    # Stored through the real services: a target may answer escaped surrogates (valid ASCII
    # JSON) or a body deeper than the decoder goes, and the page pretty-prints JSON bodies.
    escaped = make_succeeded_call("acme", name="escaped", response_body='{"a": "\\ud800"}')
    deep = make_succeeded_call("acme", name="deep", response_body="[" * 3000)

    assert "&quot;a&quot;: &quot;\ufffd&quot;" in _ok(owner_client.get(f"/calls/{escaped.pk}/"))
    assert "[" * 3000 in _ok(owner_client.get(f"/calls/{deep.pk}/"))


# --- the rendering helpers ----------------------------------------------------------------


def test_a_log_line_about_bad_text_is_valid_utf8_with_the_text_escaped():
    record = logging.makeLogRecord(
        {
            "name": "eventservice.api",
            "levelname": "WARNING",
            "msg": "refused %s",
            "args": ("k\ud800",),
            "tenantId": "acme\udc00",
        }
    )

    line = JsonFormatter().format(record)

    entry = json.loads(line.encode("utf-8"))
    assert (entry["msg"], entry["tenantId"]) == ("refused k\ud800", "acme\udc00")


def test_clipping_cuts_what_nests_deeper_than_the_limit_and_keeps_the_rest():
    value = {"a": [1, {"b": nested(5, "leaf")}], "c": "d"}

    assert clipped(value, 3) == {"a": [1, {"b": CLIPPED}], "c": "d"}
    assert clipped(value, 10) == value
    assert display_json(nested(100_000)).count("[") <= 200
    assert json.loads(json_response({"deep": nested(100_000)}).content)["deep"] == nested(99, CLIPPED)


def test_every_template_renders_a_lone_surrogate_as_a_replacement_character():
    # The one engine of settings.TEMPLATES: the dashboard's pages and the admin's.
    page = engines["django"].from_string("<p>{{ text }}</p>").render({"text": "a\ud800b"})

    assert page == "<p>a\ufffdb</p>"
    assert [type(engine) for engine in engines.all()] == [DjangoTemplates]
