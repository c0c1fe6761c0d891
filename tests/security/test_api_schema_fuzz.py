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
sequences of up to 6 steps, no deadline, the same examples every run.
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


# The fields whose rules JSON Schema cannot state: a 400 that names only these answers
# schema-valid data as the API documents.
BEYOND_THE_SCHEMA = {
    "cursor": "a cursor is one the API issued (its next and previous links)",
    "after": "an event feed's iterator is one the feed returned",
    "url": "a URL's host is a valid host name or address that the egress policy allows",
    "requestSpec.url": "as url",
    "tokenUrl": "as url",
    "requestSpec.body": "no string or key at any depth holds a NUL or a lone surrogate",
    "requestSpec.headers": "header names are tokens and not the agent's own (OpenAPI 3.0 cannot constrain keys)",
    "requestSpec.connection": "the connection exists",
    "idempotencyKey": "the body's key equals the Idempotency-Key header, when both are given",
    "dueAt": "at most one year ahead",
    "startAt": "at most one year ahead",
    "endAt": "in the future, after startAt",
    "to": "a backfill's to is after its from",
    "since": "a recovery's since is not in the future",
    "cron": "a cron expression's fields and their ranges",
    "every": "at most 366 days",
    "catchupWindow": "a duration between a minute and the schedule's limit",
    "timezone": "a name in the machine's time zone database",
    "pausedNote": "given with paused: true",
    "retryPolicy.minBackoffMs": "at most maxBackoffMs",
    "headerName": "not a header the agent sets itself (Host, Content-Type, webhook-*)",
    "tags": "a bulk addTags or removeTags names at least one",
    "rotateSecret": "a signing secret is rotated while signing is enabled",
    "hosts": "flow control's hosts are host names, with a port (OpenAPI 3.0 cannot constrain keys)",
}
# A connection's PATCH takes the fields of the kind it was made with, which its body does not
# name, and its name and kind only unchanged.
CONNECTION_FIELDS = {
    "name", "kind", "username", "password", "headerName", "headerValue", "tokenUrl", "clientId", "clientSecret", "scope",
    "audience", "clientAuth",
}  # fmt: skip


def valid_data_accepted(ctx, response, case):
    """Schemathesis' positive_data_acceptance, but for the rules of BEYOND_THE_SCHEMA."""
    try:
        return checks.positive_data_acceptance(ctx, response, case)
    except Failure:
        if response.status_code != 400:
            raise
        # A key of a map names its field as `hosts["api.example.com"]`.
        fields = {field.split("[", 1)[0] for field in json.loads(response.content).get("errors") or {}}
        beyond = set(BEYOND_THE_SCHEMA)
        if case.operation.definition.raw.get("operationId") == "connections_update":
            beyond |= CONNECTION_FIELDS
        if not fields or not fields <= beyond:
            raise
    return None


def invalid_data_refused(ctx, response, case):
    """Schemathesis' negative_data_rejection, but a batch answers each of its calls apart: 200,
    with a 400 in the result of a call that is not valid (docs/api.md, "Batches")."""
    try:
        return checks.negative_data_rejection(ctx, response, case)
    except Failure:
        if case.operation.definition.raw.get("operationId") != "service_calls_submit_batch" or response.status_code != 200:
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


# The API key that sequences following the links carry (set by their test: a fresh one per test).
_sequence_key: dict[str, str] = {}

if schema is not None:
    # A schema of its own: the key provider below applies to every operation of the schema it is
    # registered on, and the single operations above carry their key themselves.
    linked_schema = _load_schema()

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
        answered: set[str] = set()  # the operations that answered 2xx

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

            def after_call(self, response, case):
                super().after_call(response, case)
                if response.status_code < 300:
                    answered.add(case.operation.definition.raw["operationId"])

            def validate_response(self, response, case, additional_checks=None, **kwargs):
                case.validate_response(response, transport_kwargs=kwargs or None, recorder=self.recorder, **ALL_CHECKS)

        Sequences.run(
            settings=settings(
                max_examples=100,
                stateful_step_count=6,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                phases=[Phase.generate],
            )
        )
        # Answered with a 2xx only for an id a link carried from the step before.
        assert answered & {
            "service_calls_retrieve", "service_calls_cancel", "service_calls_rerun", "service_calls_tags_set",
            "subscriptions_retrieve", "subscriptions_deliveries", "subscriptions_send_test", "schedules_retrieve",
            "connections_retrieve",
        }, sorted(answered)  # fmt: skip
