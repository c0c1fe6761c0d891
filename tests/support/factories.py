"""One factory per domain object, each going through the product's own services, so a test's
data is stored exactly as the product stores it (validation, events, timers, sealing).

Defaults are deterministic and harmless: a call's URL is the discard port of 127.0.0.1,
which nothing in the tests listens on.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from core.ids import new_id, new_id_dated_as, utcnow
from execution.http import HttpRequest
from execution.outcomes import ErrorKind, Outcome
from execution.services import AttemptOrder, attempts_begin, attempts_finish
from orchestration.models import ServiceCall
from orchestration.services import service_call_finish, service_call_start, service_call_submit
from orchestration.validation import Submission, validate_submission
from outbox.models import OutboxEvent
from outbox.partitions import OUTBOX_DAYS
from outbox.services import NewEvent, outbox_append
from tenants.models import ApiKey, Membership, Tenant
from tenants.services import api_key_create, membership_add, tenant_create

# Nothing listens on port 9 (discard): a call that should never run cannot reach anything.
NEVER_CALLED = "http://127.0.0.1:9/never-called"
# A due time far enough ahead that a call stays Scheduled for the whole test.
HOUR = 3600.0


# --- Tenants, users, memberships, API keys -----------------------------------------------------


def make_tenant(slug: str = "acme", *, name: str | None = None) -> Tenant:
    return tenant_create(slug=slug, name=name if name is not None else slug.capitalize())


def make_user(username: str, *, password: str | None = None, superuser: bool = False, **fields: Any):
    """A user whose password is `pw-<username>-123` unless given."""
    user_model = get_user_model()
    password = password if password is not None else f"pw-{username}-123"
    if superuser:
        return user_model.objects.create_superuser(username, password=password, **fields)
    return user_model.objects.create_user(username, password=password, **fields)


def make_member(
    username: str, tenant_id: str = "acme", *, role: str = Membership.Role.MEMBER, password: str | None = None
) -> Membership:
    """`username` (created first when missing) made a member of `tenant_id`."""
    if not get_user_model().objects.filter(username=username).exists():
        make_user(username, password=password)
    return membership_add(username=username, tenant_id=tenant_id, role=role)


def make_api_key(tenant_id: str = "acme", *, label: str | None = None) -> tuple[ApiKey, str]:
    """(the stored key, the raw key a client presents)."""
    return api_key_create(tenant_id=tenant_id, label=label if label is not None else f"{tenant_id} test")


# --- Service calls -------------------------------------------------------------------------------


def submission_data(
    *,
    name: str = "call",
    method: str = "GET",
    url: str = NEVER_CALLED,
    headers: dict[str, Any] | None = None,
    body: Any = None,
    timeout_ms: int | None = None,
    tags: Iterable[str] = (),
    due_in: float | None = None,
    due_at: datetime | None = None,
    idempotency_key: str | None = None,
    retry_policy: dict[str, Any] | None = None,
    connection: str | None = None,
) -> dict[str, Any]:
    """A submission in the wire shape every edge takes. No due time means due now; `due_in` is
    seconds from now, `due_at` an instant (give one of them)."""
    assert due_in is None or due_at is None, "give due_in or due_at, not both"
    spec: dict[str, Any] = {"method": method, "url": url}
    if headers is not None:
        spec["headers"] = headers
    if body is not None:
        spec["body"] = body
    if timeout_ms is not None:
        spec["timeoutMs"] = timeout_ms
    if connection is not None:
        spec["connection"] = connection
    data: dict[str, Any] = {"name": name, "requestSpec": spec, "tags": list(tags)}
    if due_in is not None:
        due_at = datetime.now(UTC) + timedelta(seconds=due_in)
    if due_at is not None:
        data["dueAt"] = due_at.isoformat()
    if idempotency_key is not None:
        data["idempotencyKey"] = idempotency_key
    if retry_policy is not None:
        data["retryPolicy"] = retry_policy
    return data


def make_submission(**fields: Any) -> Submission:
    """A submission checked by the edges' validation (fields: as `submission_data`)."""
    return validate_submission(submission_data(**fields))


def make_call(
    tenant_id: str = "acme",
    *,
    name: str = "call",
    method: str = "GET",
    url: str = NEVER_CALLED,
    headers: dict[str, Any] | None = None,
    body: Any = None,
    timeout_ms: int | None = None,
    tags: Iterable[str] = (),
    due_in: float | None = None,
    due_at: datetime | None = None,
    idempotency_key: str | None = None,
    retry_policy: dict[str, Any] | None = None,
    correlation_id: str = "test-corr",
    connection: str | None = None,
) -> ServiceCall:
    """A call stored Scheduled as every edge stores one: validation, then service_call_submit.
    Due now unless `due_in` (seconds) or `due_at` says otherwise. Raises ValidationFailed for a
    submission the edges refuse."""
    submission = make_submission(
        name=name,
        method=method,
        url=url,
        headers=headers,
        body=body,
        timeout_ms=timeout_ms,
        tags=tags,
        due_in=due_in,
        due_at=due_at,
        idempotency_key=idempotency_key,
        retry_policy=retry_policy,
        connection=connection,
    )
    call, _ = service_call_submit(tenant_id=tenant_id, submission=submission, correlation_id=correlation_id)
    return call


def make_finished_call(tenant_id: str = "acme", *, outcome: Outcome, **fields: Any) -> ServiceCall:
    """A call due now, run to `outcome` the way the engine runs one (start, attempt logged,
    finish), without any HTTP; re-read from the database. Fields: as `make_call`."""
    call = make_call(tenant_id, **fields)
    started = service_call_start(tenant_id=tenant_id, service_call_id=call.pk)
    assert started is not None
    request = HttpRequest(
        method=started.method,
        url=started.url,
        headers=started.headers,
        body=started.body,
        timeout_ms=started.timeout_ms,
    )
    order = AttemptOrder(
        tenant_id=tenant_id, service_call_id=call.pk, correlation_id=started.correlation_id, request=request
    )
    attempts = attempts_begin(orders=[order], worker_id="test-worker-1")
    attempts_finish(results=[(attempts[0], outcome)])
    assert service_call_finish(tenant_id=tenant_id, service_call_id=call.pk, outcome=outcome)
    return ServiceCall.objects.get(pk=call.pk)


def make_succeeded_call(
    tenant_id: str = "acme", *, name: str = "ok call", response_body: Any = '{"hello":"world","n":[1,2]}', **fields: Any
) -> ServiceCall:
    """A call that Succeeded: 200 with a JSON body, 42 ms."""
    outcome = Outcome(
        succeeded=True,
        status=200,
        headers={"Content-Type": "application/json", "X-Served-By": "target-7"},
        body_snippet=response_body,
        latency_ms=42,
    )
    return make_finished_call(tenant_id, name=name, outcome=outcome, **fields)


def make_failed_call(tenant_id: str = "acme", *, name: str = "failing call", **fields: Any) -> ServiceCall:
    """A call that Failed: HttpError, 503, 17 ms."""
    outcome = Outcome.failure(
        ErrorKind.HTTP_ERROR, "The target answered 503 Service Unavailable.", status=503, latency_ms=17
    )
    return make_finished_call(tenant_id, name=name, outcome=outcome, **fields)


# --- Outbox events -------------------------------------------------------------------------------


def make_event(
    tenant_id: str = "acme",
    *,
    aggregate_id: Any = None,
    event_type: str = "ServiceCallTagged",
    payload: dict[str, Any] | None = None,
    correlation_id: str = "c",
    published_days_ago: float | None = None,
    made_at: datetime | None = None,
) -> OutboxEvent:
    """An event appended by outbox_append in its own transaction (a fresh aggregate unless
    given); with `published_days_ago`, marked published that long ago; with `made_at`, made
    then (its id dated then, as new_id would have made it: where the outbox is partitioned, it
    moves to that day's partition)."""
    event = NewEvent(
        tenant_id=tenant_id,
        aggregate_id=aggregate_id if aggregate_id is not None else new_id(),
        type=event_type,
        payload=payload if payload is not None else {},
        correlation_id=correlation_id,
        at=utcnow(),
    )
    with transaction.atomic():
        [event_id] = outbox_append(events=[event])
        if published_days_ago is not None:
            # In the same transaction: a running dispatcher never sees the row unpublished
            # (publishing it would overwrite the age this test gives it).
            OutboxEvent.objects.filter(event_id=event_id).update(
                published_at=utcnow() - timedelta(days=published_days_ago)
            )
        if made_at is not None:
            made = new_id_dated_as(OUTBOX_DAYS.key_at(made_at))
            envelope = OutboxEvent.objects.get(event_id=event_id).event_payload
            envelope.update(id=str(made), timestampMs=int(made_at.timestamp() * 1000))
            OutboxEvent.objects.filter(event_id=event_id).update(
                event_id=made, created_at=made_at, event_payload=envelope
            )
            event_id = made
    return OutboxEvent.objects.get(event_id=event_id)


# --- Flow control ----------------------------------------------------------------------------------


def make_flow_control(
    tenant_id: str = "acme",
    *,
    parallelism: int | None = None,
    rate: float | None = None,
    hosts: dict[str, dict[str, Any]] | None = None,
):
    """The tenant's flow-control limits set as every edge sets them (validation, then
    flow_control_set); `hosts` in the wire shape {host: {parallelism, ratePerSecond}}."""
    from orchestration.admission import flow_control_set
    from orchestration.flow import validate_flow_control

    limits = validate_flow_control({"parallelism": parallelism, "ratePerSecond": rate, "hosts": hosts or {}})
    return flow_control_set(tenant_id=tenant_id, limits=limits)


def make_ceilings(tenant_id: str = "acme", **wire: Any) -> dict[str, Any]:
    """The operator's ceilings for a tenant, set as the admin and the command set them
    (validate_ceilings, then tenant_ceilings_set); `wire` by wire name: parallelism=2,
    ratePerSecond=1.5, submissionsPerSecond=3, ..."""
    from tenants.ceilings import validate_ceilings
    from tenants.services import tenant_ceilings_set

    return tenant_ceilings_set(tenant_id=tenant_id, changes=validate_ceilings(wire))
