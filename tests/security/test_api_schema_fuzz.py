"""Schemathesis against /api/schema/: generated requests (valid and invalid) to every API
operation, through the Django WSGI app in this process (no network).

No response may be a 5xx, every response must conform to the schema (status codes, content
types, bodies, headers), and auth must not be ignored.
Requests are authenticated with acme's API key and aimed at acme's tenant and at one of its
real calls, subscriptions, deliveries and schedules, so handlers are exercised past the 404 of an unknown id. Bounded: at most 25 generated examples per
operation (valid and invalid ones), no deadline.

Not run: schemathesis' "schema-valid data is accepted" and "schema-invalid data is refused".
The schema approximates rules JSON Schema cannot state (a URL must have a valid host that is
not a refused IP literal, a cursor must be one the API issued, the Idempotency-Key header
must equal the body's key, a repeated or empty query parameter counts as its last or no
value), so those checks fail on rules, not bugs, and on whichever examples a seed draws;
tests/security/test_validation.py and the API tests pin the rules themselves.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings
from schemathesis import checks
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
        case.call_and_validate(
            headers=auth, excluded_checks=[checks.positive_data_acceptance, checks.negative_data_rejection]
        )
