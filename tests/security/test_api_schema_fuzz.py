"""Schemathesis against /api/schema/, through the Django WSGI app in this process (no network),
with every check it has: each operation on its own (generated requests, valid and invalid), and
sequences that follow the schema's links (a submitted call to its detail, cancel, rerun and tags;
a subscription to its deliveries and test; a schedule to its calls; a connection to itself).

No response may be a 5xx, every response must conform to the schema (status codes, content
types, bodies, headers), auth must not be ignored, schema-invalid data must be refused, and
schema-valid data accepted, except where a rule is one JSON Schema cannot state: those are
listed in BEYOND_THE_SCHEMA, and a refusal that names any other field fails the test.
Requests are authenticated with acme's API key and aimed at acme's tenant (and, each operation
alone, at one of its real calls, subscriptions, deliveries and schedules, so handlers are
exercised past the 404 of an unknown id). Bounded: 25 generated examples per operation, 100
sequences of up to 10 steps, no deadline, the same examples every run.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, Phase, settings
from schemathesis import checks
from schemathesis.core.failures import Failure
from schemathesis.generation.meta import ParameterLocation

from tests.support.factories import make_call
from tests.support.schedules import make_schedule
from tests.support.subscriptions import fan_out, make_subscription


def _load_schema():
    from eventservice.wsgi import application

    # Loaded at collection (schemathesis' lazy from_fixture needs pytest < 9); generating the
    # schema touches no database.
    return schemathesis.openapi.from_wsgi("/api/schema/", application)


try:
    schema = _load_schema()
    _load_error: Exception | None = None
except Exception as exc:  # a broken URLconf must fail this test, not abort the whole collection
    schema, _load_error = None, exc


@pytest.fixture
def wsgi_requests_keep_the_test_transaction(db):
    """As Django's test client does: a request must not close the connection holding the
    test's transaction (Django closes it when a WSGI request finishes)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def acme_call(world) -> str:
    return str(make_call(name="fuzzed", tags=["fuzz"], headers={"Authorization": "Bearer x"}).pk)


@pytest.fixture
def acme_schedule(world) -> str:
    return str(make_schedule(name="fuzzed schedule", cron="0 9 * * 1-5", headers={"Authorization": "Bearer x"}).pk)


@pytest.fixture
def acme_delivery(world) -> tuple[str, str]:
    """acme's webhook subscription and one delivery of it (of a call made after it)."""
    subscription, _ = make_subscription("acme", name="fuzzed hook")
    [notification, *_] = fan_out(make_call(name="fuzzed delivery").pk)
    return str(subscription.pk), str(notification.pk)


# The rules JSON Schema cannot state: field -> (the rule, the refusals' words; none: any refusal
# of that field). A 400 whose every refusal is one of these answers schema-valid data as the API
# documents; any other refusal fails the test.
BEYOND_THE_SCHEMA: dict[str, tuple[str, tuple[str, ...]]] = {
    "cursor": ("a cursor is one the API issued (its next and previous links)", ()),
    "after": ("an event feed's iterator is one the feed returned", ()),
    "url": (
        "a URL's host and port are valid and the egress policy allows the host",
        ("host", "port", "malformed", "egress policy"),
    ),
    "requestSpec.url": ("as url", ("host", "port", "malformed", "egress policy")),
    "tokenUrl": ("as url", ("host", "port", "malformed", "egress policy")),
    "requestSpec.body": ("no string or key at any depth holds a NUL or a lone surrogate", ("NUL", "surrogate")),
    "requestSpec.headers": (
        "header names are tokens and not the agent's own (OpenAPI 3.0 cannot constrain keys)",
        ("Header name", "set by the agent", "A key in requestSpec.headers", "the connection"),
    ),
    "requestSpec.connection": ("the connection exists", ("No connection named",)),
    "idempotencyKey": ("the body's key equals the header, when both are given", ("differs from the Idempotency-Key",)),
    "dueAt": ("at most one year ahead", ("one year",)),
    "startAt": ("at most one year ahead", ("one year",)),
    "endAt": ("in the future, after startAt", ()),
    "to": ("a backfill's to is after its from", ()),
    "since": ("a recovery's since is not in the future", ("future",)),
    "from": ("a backfill reaches back to 1970 at the earliest", ("1970 or later",)),
    "cron": ("a cron expression's fields and their ranges", ()),
    "every": ("at most 366 days", ()),
    "catchupWindow": ("a duration between a minute and the schedule's limit", ()),
    "timezone": ("a name in the machine's time zone database", ()),
    "pausedNote": ("given with paused: true", ("paused: true", "pause it too")),
    "retryPolicy.minBackoffMs": ("at most maxBackoffMs", ("maxBackoffMs",)),
    "headerName": (
        "not a header the agent sets itself (Host, Content-Type, webhook-*)",
        ("not a credential", "set by"),
    ),
    "tags": (
        "a bulk addTags or removeTags names at least one, other actions none",
        ("At least one tag is required", "Only addTags and removeTags take tags"),
    ),
    "rotateSecret": ("a signing secret is rotated while signing is enabled", ("while signing is enabled",)),
    "hosts": ("flow control's hosts are host names, with a port (OpenAPI 3.0 cannot constrain keys)", ()),
}
# A connection's PATCH takes the fields of the kind it was made with, which its body does not
# name, and its name and kind only unchanged.
CONNECTION_PATCH = ("Unknown field for a", "cannot change")


def _beyond_the_schema(case, field: str, message: str) -> bool:
    if case.operation.definition.raw.get("operationId") == "connections_update" and any(
        words in message for words in CONNECTION_PATCH
    ):
        return True
    rule = BEYOND_THE_SCHEMA.get(field.split("[", 1)[0])  # a map's key: `hosts["api.example.com"]`
    return rule is not None and (not rule[1] or any(words in message for words in rule[1]))


def valid_data_accepted(ctx, response, case):
    """Schemathesis' positive_data_acceptance, but for the rules of BEYOND_THE_SCHEMA."""
    try:
        return checks.positive_data_acceptance(ctx, response, case)
    except Failure:
        if response.status_code != 400:
            raise
        errors = json.loads(response.content).get("errors") or {}
        refusals = [(field, message) for field, messages in errors.items() for message in messages]
        if not refusals or not all(_beyond_the_schema(case, field, message) for field, message in refusals):
            raise
    return None


def invalid_data_refused(ctx, response, case):
    """Schemathesis' negative_data_rejection, but a batch answers each of its calls apart: 200,
    with a 400 in the result of a call that is not valid (docs/api.md, "Batches")."""
    try:
        return checks.negative_data_rejection(ctx, response, case)
    except Failure:
        if (
            case.operation.definition.raw.get("operationId") != "service_calls_submit_batch"
            or response.status_code != 200
        ):
            raise
        if not any(result["status"] == 400 for result in json.loads(response.content)["results"]):
            raise
    return None


ALL_CHECKS = {
    "excluded_checks": [checks.positive_data_acceptance, checks.negative_data_rejection],
    "additional_checks": [valid_data_accepted, invalid_data_refused],
}


def _negative(case, location: ParameterLocation) -> bool:
    meta = case._meta  # schemathesis keeps which parts of a case were generated invalid here
    return meta is not None and meta.is_negative_at(location)


if schema is None:

    def test_the_api_schema_loads():
        pytest.fail(f"GET /api/schema/ could not be loaded: {_load_error!r}")

else:
    # Generated examples only: schemathesis' coverage phase builds its cases while pytest
    # collects, which costs about a minute here even when this test is not selected.
    @schema.parametrize()
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        phases=[Phase.generate],
    )
    def test_every_api_operation_conforms_to_its_schema(
        case, world, acme_call, acme_delivery, acme_schedule, wsgi_requests_keep_the_test_transaction
    ):
        # Aim valid paths at acme and its call; an invalid path or header stays as generated.
        if not _negative(case, ParameterLocation.PATH):
            parameters = case.path_parameters or {}
            if "tenant_id" in parameters:
                parameters["tenant_id"] = "acme"
            if "service_call_id" in parameters:
                parameters["service_call_id"] = acme_call
            if "subscription_id" in parameters:
                parameters["subscription_id"] = acme_delivery[0]
            if "notification_id" in parameters:
                parameters["notification_id"] = acme_delivery[1]
            if "schedule_id" in parameters:
                parameters["schedule_id"] = acme_schedule
        auth = {} if _negative(case, ParameterLocation.HEADER) else {"Authorization": f"Bearer {world.acme_key}"}
        # The schema cannot say "the Idempotency-Key header, if given, equals the body's key"
        # (a mismatch is a documented 400): a positive case keeps them equal.
        header_key = (case.headers or {}).get("Idempotency-Key")
        body_key = case.body.get("idempotencyKey") if isinstance(case.body, dict) else None
        if (
            isinstance(body_key, str)
            and header_key is not None
            and not _negative(case, ParameterLocation.HEADER)
            and not _negative(case, ParameterLocation.BODY)
        ):
            if body_key.isprintable() and body_key.isascii() and body_key == body_key.strip():
                case.headers["Idempotency-Key"] = body_key
            else:  # not something a client can put in a header (HTTP strips a value's outer
                # spaces, and requests refuses them): keep the body's key alone
                del case.headers["Idempotency-Key"]
        case.call_and_validate(headers=auth, **ALL_CHECKS)


def _made(operation: str | None, body: dict) -> None:
    """A valid body to make a resource, most of its generated fields kept: a call, a schedule or
    a subscription refused for a rule beyond the schema (a header name, a cron's range, a host)
    would leave the links from it unfollowed."""
    request = {"method": body.get("requestSpec", {}).get("method", "GET"), "url": "https://api.example.com/fuzz"}
    if operation == "service_calls_submit":
        body.update(requestSpec=request)
        for field in ("dueAt", "idempotencyKey"):
            body.pop(field, None)
    elif operation == "schedules_create":
        body.update(requestSpec=request, cron="0 9 * * 1-5", timezone="UTC")
        for field in ("every", "startAt", "endAt", "catchupWindow", "pausedNote"):
            body.pop(field, None)
    elif operation == "subscriptions_create":
        body.update(kind="webhook", url="https://hooks.example.com/fuzz")


# The API key that sequences following the links carry (set by their test: a fresh one per test).
_sequence_key: dict[str, str] = {}

if schema is not None:
    # A schema of its own: the key provider below applies to every operation of the schema it is
    # registered on, and the single operations above carry their key themselves.
    linked_schema = _load_schema()
    # Schema-valid steps only: a sequence goes on from what its steps made (each operation above
    # also gets invalid input).
    linked_schema.config.generation.update(modes=["positive"])
    # The schema's own links only: schemathesis would also guess some from field names (a
    # schedule's id as a call's), diluting the sequences with steps bound to answer 404.
    linked_schema.config.phases.stateful.inference.algorithms = []

    @linked_schema.auth()
    class AcmeKey:
        """acme's API key, as schemathesis' explicit credentials: its auth check then sends each
        operation again without the key and with a wrong one, and expects a 401."""

        def get(self, case, context):
            return _sequence_key.get("key")

        def set(self, case, key, context):
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}"}

    def test_sequences_that_follow_the_links_conform_to_the_schema(world, wsgi_requests_keep_the_test_transaction):
        _sequence_key["key"] = world.acme_key
        answered: set[str] = set()  # the paths of the operations that answered 2xx

        class Sequences(linked_schema.as_state_machine()):
            def setup(self):
                # Each sequence starts from the same data: what one made, its rollback forgets
                # (Hypothesis requires a sequence's steps not to depend on the ones before it).
                self._sequence = transaction.atomic()
                self._sequence.__enter__()

            def teardown(self):
                transaction.set_rollback(True)
                self._sequence.__exit__(None, None, None)

            def before_call(self, case):
                parameters = case.path_parameters or {}
                if "tenant_id" in parameters and not _negative(case, ParameterLocation.PATH):
                    parameters["tenant_id"] = "acme"  # a link carries it on to the next step
                if isinstance(case.body, dict) and not _negative(case, ParameterLocation.BODY):
                    _made(case.operation.definition.raw.get("operationId"), case.body)

            def after_call(self, response, case):
                super().after_call(response, case)
                if response.status_code < 300:
                    answered.add(case.operation.path)

            def validate_response(self, response, case, additional_checks=None, **kwargs):
                case.validate_response(response, transport_kwargs=kwargs or None, recorder=self.recorder, **ALL_CHECKS)

        Sequences.run(
            settings=settings(
                max_examples=100,
                stateful_step_count=10,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                phases=[Phase.generate],
            )
        )
        # An operation on one call, subscription, schedule or connection answers a 2xx only for an
        # id a link carried from the step before: each resource's links were followed.
        for resource in ("{service_call_id}", "{subscription_id}", "{schedule_id}", "/connections/{name}"):
            assert any(resource in path for path in answered), (resource, sorted(answered))
