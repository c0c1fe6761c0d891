"""The OpenAPI schema and the validation agree where a client's generator or a fuzzer would
find them apart (schemathesis found these): the name and tag patterns leave out every control
and invisible formatting character the server refuses (C1 and DEL included); a subscription's
`enabled` is a boolean (null is refused, as the schema says); the flow-control body is closed;
an empty `dueAt` is refused; a URL's form, a header's value, a connection's fields by its kind and a
schedule's cron-or-interval are in the schema as the server checks them."""

from __future__ import annotations

import re

import jsonschema
import pytest
from django.test import Client

from core.text import name_problem, tag_problem
from execution.egress import EgressPolicy
from execution.targets import header_value_error, url_error
from tests.support.api import ApiClient, calls_url, valid_payload


@pytest.fixture(scope="module")
def schema(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        return Client().get("/api/schema/?format=json").json()


def _pattern(schema, component: str, field: str) -> re.Pattern:
    prop = schema["components"]["schemas"][component]["properties"][field]
    return re.compile((prop.get("items") or prop)["pattern"])


@pytest.mark.parametrize("ch", ["\x85", "\x9f", "\x7f", "\x00", "\u200b", "\u202e", "\ufeff", "\u00ad"])
def test_a_character_the_server_refuses_in_a_name_or_tag_the_schema_refuses_too(schema, ch):
    assert name_problem(f"a{ch}b") is not None and tag_problem(f"a{ch}b") is not None
    for component in ("SubmitServiceCallRequest", "CreateScheduleRequest", "CreateSubscriptionRequest"):
        assert not _pattern(schema, component, "name").match(f"a{ch}b"), component
    for component in ("SubmitServiceCallRequest", "CreateScheduleRequest", "CreateSubscriptionRequest"):
        assert not _pattern(schema, component, "tags").match(f"a{ch}b"), component
    assert _pattern(schema, "SubmitServiceCallRequest", "name").match("Nightly export (v2) — ünïcode")


def test_closed_bodies_and_booleans(schema, world):
    assert schema["components"]["schemas"]["FlowControlInputRequest"]["additionalProperties"] is False
    api = ApiClient(world.acme_key)
    answer = api.post(
        "/api/tenants/acme/subscriptions",
        {"kind": "webhook", "name": "s", "url": "https://hooks.example.com/x", "enabled": None},
    )
    assert answer.status_code == 400 and "enabled" in answer.json()["errors"], answer.json()
    # Null is no "absent" where the schema's type is not nullable (schemathesis found `name: null`).
    made = api.post("/api/tenants/acme/subscriptions", {"name": "s", "url": "https://hooks.example.com/x"}).json()
    for field in ("name", "url", "eventTypes", "tags"):
        answer = api.patch(f"/api/tenants/acme/subscriptions/{made['subscriptionId']}", {field: None})
        assert answer.status_code == 400 and field in answer.json()["errors"], (field, answer.json())
    for field in ("kind", "name", "eventTypes", "tags"):
        body = {"name": "t", "url": "https://hooks.example.com/x", field: None}
        answer = api.post("/api/tenants/acme/subscriptions", body)
        assert answer.status_code == 400 and field in answer.json()["errors"], (field, answer.json())
    empty = api.post(calls_url("acme"), valid_payload(dueAt=""))
    assert empty.status_code == 400 and "dueAt" in empty.json()["errors"]
    # What a GET gave may be PUT back: the read-only part is in the schema, and ignored.
    flow = api.get("/api/tenants/acme/flow-control").json()
    assert api.put("/api/tenants/acme/flow-control", flow).status_code == 200


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ("sa_abc", 'Put \\"Bearer \\" before the API key'),
        ("Token sa_abc", "The API takes"),
        ("Basic dXNlcjpwdw==", "The API takes"),
    ],
)
def test_an_authorization_header_without_bearer_says_the_form_to_use(world, header, words):
    answer = Client().get("/api/tenants/acme/service-calls", HTTP_AUTHORIZATION=header)
    assert answer.status_code == 401 and words in answer.content.decode(), answer.content


def test_a_session_request_behind_a_proxys_basic_login_still_works(world):
    """A reverse proxy's Basic login sends its Authorization header with every request: the
    dashboard's own API calls (its session) must not be refused for it."""
    member = Client()
    member.force_login(world.owner)
    answer = member.get("/api/tenants/acme/service-calls", HTTP_AUTHORIZATION="Basic dXNlcjpwdw==")
    assert answer.status_code == 200


def test_the_bearer_scheme_is_case_insensitive(world):
    answer = Client().get("/api/tenants/acme/service-calls", HTTP_AUTHORIZATION=f"bearer {world.acme_key}")
    assert answer.status_code == 200


def test_a_header_of_only_whitespace_is_no_credentials_not_an_error(world):
    answer = Client().get("/api/tenants/acme/service-calls", HTTP_AUTHORIZATION="\u00a0")
    assert answer.status_code == 401


def test_the_name_pattern_takes_what_the_server_takes_across_lines(schema):
    name = "\u2028Nightly"
    assert name_problem(name) is None
    assert _pattern(schema, "SubmitServiceCallRequest", "name").match(name)


def _validator(schema, component: str):
    """A JSON Schema validator of a component, its references resolved in the whole document."""
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{component}", **schema})


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com/v1/x?y=1#z",
        "HTTP://api.example.com",
        "http://[::1]:8080/",
        "http://127.0.0.1:8000/mock/json",
        "api:service-calls",
        "ftp://files.example.com/x",
        "http://user:pw@api.example.com/",
        "http://api.example.com\\@evil.example/",
        "http://api.example.com/a b",
        "http://api.example.com/\x7f",
        "http:///x",
        "//api.example.com/x",
        # Taken by the server and stored as given: RFC 3986's `format: uri` would refuse them.
        "https://bücher.example/café",
        "https://api.example.com/?q={a}|b",
        "https://api.example.com/%zz/😀",
        # Refused by both: an invisible or a C1 control character.
        "https://api.example.com/\ufeffx",
        "https://api.example.com/\u200bx",
        "https://api.example.com/\x85x",
        "https://api.example.com/\x9fx",
    ],
)
def test_a_url_the_server_takes_the_pattern_takes_and_one_it_refuses_for_its_form_the_pattern_refuses(schema, url):
    taken = url_error(url, policy=EgressPolicy.from_settings()) is None
    for component, field in (
        ("RequestSpecRequest", "url"),
        ("CreateSubscriptionRequest", "url"),
        ("Oauth2ClientCredentialsConnectionInputRequest", "tokenUrl"),
    ):
        matches = bool(_pattern(schema, component, field).match(url))
        assert matches or not taken, (component, url)
    if not url.lower().startswith(("http://", "https://")) or any(ch in url for ch in "@ \\\ufeff\u200b\x85\x9f"):
        assert not taken and not _pattern(schema, "RequestSpecRequest", "url").match(url)
    assert "format" not in schema["components"]["schemas"]["RequestSpecRequest"]["properties"]["url"]


def test_a_header_value_the_pattern_takes_is_one_the_server_takes(schema):
    value = re.compile(
        schema["components"]["schemas"]["RequestSpecRequest"]["properties"]["headers"]["additionalProperties"][
            "pattern"
        ]
    )
    for code in range(0x300):
        ch = chr(code)
        assert bool(value.match(f"a{ch}b")) == (header_value_error("X", f"a{ch}b") is None), hex(code)


def test_a_connection_takes_the_fields_of_its_kind(schema, world):
    body = {"name": "crm", "kind": "apiKeyHeader", "headerName": "X-Api-Key", "headerValue": "k-123"}
    connection = _validator(schema, "ConnectionInputRequest")
    assert connection.is_valid(body)
    for wrong in (
        {**body, "username": "u"},
        {**body, "kind": "basic"},
        {k: v for k, v in body.items() if k != "headerValue"},
    ):
        assert not connection.is_valid(wrong), wrong
        answer = ApiClient(world.acme_key).post("/api/tenants/acme/connections", wrong)
        assert answer.status_code == 400, (wrong, answer.json())
    assert ApiClient(world.acme_key).post("/api/tenants/acme/connections", body).status_code == 201


def test_a_schedule_takes_a_cron_or_an_interval(schema, world):
    schedule = _validator(schema, "CreateScheduleRequest")
    body = {"name": "nightly", "requestSpec": {"method": "GET", "url": "https://api.example.com/x"}}
    assert schedule.is_valid({**body, "cron": "0 2 * * *"}) and schedule.is_valid({**body, "every": "15m"})
    for wrong in (body, {**body, "cron": "0 2 * * *", "every": "15m"}):
        assert not schedule.is_valid(wrong)
        assert ApiClient(world.acme_key).post("/api/tenants/acme/schedules", wrong).status_code == 400
