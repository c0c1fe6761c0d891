"""Tenant isolation, generated from the URLconf: every API route, page and admin page is
requested by outsiders of tenant acme, with real ids of acme's objects in the URL.

Outsiders: globex's API key, a member of globex, a non-superuser staff member of globex
holding every permission of the product's apps, and an anonymous visitor. Each route is
requested with GET, and with the writing methods too (admin pages: POST), carrying data that
aims at acme. No response may carry acme's data: its calls' names, URL and tags, or the id of
its second call, which no request ever names (the first call's id is in the outsider's own
URLs, so pages may echo it back). An acme object's route never answers 200, an acme API path
answers 404 (never 403), nothing answers 5xx, and afterwards acme's rows are unchanged.
New routes are covered as they appear; a parameter the filler cannot fill fails the test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from core.ids import short_id
from delivery.models import Notification, Subscription
from execution.connections import connection_create, validate_connection
from execution.models import CallSigning, Connection
from execution.signing import call_signing_set
from orchestration.models import FlowControl, ServiceCall, ServiceCallTag
from orchestration.services import CallKey
from outbox.models import OutboxEvent
from schedules.models import Schedule
from tenants.models import ApiKey, Membership
from tests.support.factories import make_call, make_flow_control
from tests.support.routes import AcmeObjects, CannotFill, Route, all_routes, fill
from tests.support.schedules import make_schedule
from tests.support.subscriptions import fan_out, make_subscription, record_try
from workers.pipeline import run_now

ACME_NAMES = ("acme-private-call-5c1e", "acme-scheduled-call-8b2f")
ACME_PATH = "/acme-private-path-9d4b"
ACME_TAG = "acme-tag-3e7a"
ACME_HOOK_NAME = "acme-hook-name-7f3c"
ACME_HOOK_PATH = "/acme-hook-path-2a9e"
ACME_HOOK_ANSWER = "acme-hook-answer-4d1b"
ACME_SCHEDULE_NAME = "acme-schedule-name-6e2c"
ACME_SCHEDULE_PATH = "/acme-schedule-path-8f1a"
ACME_FLOW_HOST = "acme-flow-host-6e2d.example.com"
ACME_CONNECTION = "acme-connection-5b8e"
ACME_TOKEN_HOST = "acme-token-host-1c9d.example.com"
ACME_CLIENT_ID = "acme-client-id-3f6a"
ACME_CLIENT_SECRET = "acme-client-secret-8d2b"
PRODUCT_APPS = ["tenants", "orchestration", "timer", "execution", "outbox", "delivery", "schedules", "workers"]
OBJECT_STATUSES = {301, 302, 303, 400, 401, 403, 404, 405}


@dataclass
class Acme:
    objects: AcmeObjects
    markers: list[str]  # acme data no outsider supplied, so no response may contain it


@pytest.fixture
def acme(transactional_db, world, http_target) -> Acme:
    """Two acme calls (one run for real: attempt, events, timer; one scheduled), a globex call,
    and an acme webhook subscription with deliveries of the scheduled call's events."""
    hook, hook_secret = make_subscription("acme", name=ACME_HOOK_NAME, url=http_target.url(ACME_HOOK_PATH))
    ran = make_call("acme", name=ACME_NAMES[0], url=http_target.url(ACME_PATH), tags=[ACME_TAG])
    run_now([CallKey("acme", ran.pk)], worker_id="isolation")
    scheduled = make_call(
        "acme",
        name=ACME_NAMES[1],
        url=http_target.url(ACME_PATH),
        tags=[ACME_TAG],
        due_at=datetime.now(UTC) + timedelta(days=30),
    )
    make_call("globex", name="globex-call", url=http_target.url("/globex"), tags=["globex-tag"])
    # An acme schedule, its first call made ahead (a globex one beside it).
    schedule = make_schedule(
        "acme", name=ACME_SCHEDULE_NAME, cron="0 0 1 1 *", url=http_target.url(ACME_SCHEDULE_PATH), tags=[ACME_TAG]
    )
    make_schedule("globex", name="globex-schedule", cron="0 0 1 1 *", url=http_target.url("/globex"))
    assert ServiceCall.objects.get(pk=ran.pk).status == ServiceCall.Status.SUCCEEDED
    # acme's webhook subscription (made before the calls) has deliveries of both calls' events
    # (those of the scheduled one carry its id, which must not show), one of them tried.
    fan_out(ran.pk)
    deliveries = [n for n in fan_out(scheduled.pk) if n.subscription_id == hook.pk]
    record_try(deliveries[0], succeeded=False, status_code=500, response_snippet=ACME_HOOK_ANSWER, error="HTTP 500")
    # acme's flow-control limits, made after its calls ran (a host no call goes to).
    make_flow_control("acme", hosts={ACME_FLOW_HOST: {"parallelism": 3}})
    # acme signs its calls (its secret, shown once, must never show again).
    _, signing_secret = call_signing_set(tenant_id="acme", enabled=True)
    # acme's connection: its token endpoint, client and secret are acme's alone (its name is in
    # the outsiders' URLs, so pages may echo it back).
    connection_create(
        tenant_id="acme",
        data=validate_connection(
            {
                "name": ACME_CONNECTION,
                "kind": "oauth2ClientCredentials",
                "tokenUrl": f"https://{ACME_TOKEN_HOST}/token",
                "clientId": ACME_CLIENT_ID,
                "clientSecret": ACME_CLIENT_SECRET,
            }
        ),
    )
    return Acme(
        objects=AcmeObjects(
            call=ran.pk,
            other_call=scheduled.pk,
            extra={
                "subscription_id": str(hook.pk),
                "notification_id": str(deliveries[0].pk),
                "schedule_id": str(schedule.pk),
                "name": ACME_CONNECTION,
            },
        ),
        markers=[
            *ACME_NAMES,
            ACME_PATH,
            ACME_TAG,
            str(scheduled.pk),
            short_id(scheduled.pk),
            ACME_HOOK_NAME,
            ACME_HOOK_PATH,
            ACME_HOOK_ANSWER,
            ACME_FLOW_HOST,
            hook_secret,
            signing_secret,
            ACME_SCHEDULE_NAME,
            ACME_SCHEDULE_PATH,
            ACME_TOKEN_HOST,
            ACME_CLIENT_ID,
            ACME_CLIENT_SECRET,
        ],
    )


def _outsider(kind: str, world) -> Client:
    if kind == "globex-api-key":
        return Client(HTTP_AUTHORIZATION=f"Bearer {world.globex_key}")
    client = Client()
    if kind == "globex-member":
        client.force_login(world.outsider)
    elif kind == "globex-staff":
        world.staff_globex.user_permissions.set(Permission.objects.filter(content_type__app_label__in=PRODUCT_APPS))
        client.force_login(world.staff_globex)
    return client


def _write_data(route: Route, acme: Acme, world) -> tuple[dict, str | None]:
    """A body aiming at acme: JSON for the API, form fields for pages and the admin."""
    if route.is_api:
        return {
            "tags": ["pwned"],
            "name": "pwned",
            "requestSpec": {"method": "GET", "url": "http://127.0.0.1:9/"},
            "tenantId": "acme",
        }, "application/json"
    return {
        "tenant": "acme",
        "tenant_id": "acme",
        "tags": "pwned",
        "favorite": "true",
        "post": "yes",
        "user": str(world.outsider.pk),
        "role": Membership.Role.OWNER,
        "label": "pwned",
        "name": "pwned",
        "action": "run_again",
        "_selected_action": [str(acme.objects.call)],
        "index": "0",
    }, None


def _leaks(text: str, acme: Acme) -> list[str]:
    return [marker for marker in acme.markers if marker in text]


def _acme_state() -> tuple:
    calls = tuple(ServiceCall.objects.filter(tenant_id="acme").order_by("pk").values_list("pk", "status", "name"))
    tags = tuple(ServiceCallTag.objects.filter(tenant_id="acme").order_by("pk").values_list("service_call_id", "tag"))
    members = tuple(Membership.objects.filter(tenant_id="acme").order_by("pk").values_list("user_id", "role"))
    keys = tuple(ApiKey.objects.filter(tenant_id="acme").order_by("pk").values_list("pk", "label", "revoked_at"))
    events = OutboxEvent.objects.filter(tenant_id="acme").count()
    hooks = tuple(
        Subscription.objects.filter(tenant_id="acme")
        .order_by("pk")
        .values_list("pk", "name", "url", "enabled", "event_types", "secret", "updated_at")
    )
    deliveries = tuple(
        Notification.objects.filter(tenant_id="acme")
        .order_by("pk")
        .values_list("pk", "state", "attempts", "manual", "next_attempt_at")
    )
    flow = tuple(FlowControl.objects.filter(tenant_id="acme").values_list("parallelism", "rate_per_second", "hosts"))
    schedules = tuple(
        Schedule.objects.filter(tenant_id="acme")
        .order_by("pk")
        .values_list("pk", "name", "cron", "paused", "advance_at", "revision")
    )
    signing = tuple(CallSigning.objects.filter(tenant_id="acme").values_list("enabled", "secret", "updated_at"))
    linked = tuple(Connection.objects.filter(tenant_id="acme").values_list("name", "config", "secret", "version"))
    return calls, tags, members, keys, events, hooks, deliveries, flow, schedules, signing, linked


def test_every_route_can_be_filled_with_acmes_ids(acme):
    routes = all_routes()
    assert len(routes) > 50
    unfilled = []
    for route in routes:
        try:
            fill(route, acme.objects)
        except CannotFill as exc:
            unfilled.append(str(exc))
    assert not unfilled, "routes the isolation matrix cannot fill:\n" + "\n".join(unfilled)


@pytest.mark.parametrize("kind", ["globex-api-key", "globex-member", "globex-staff", "anonymous"])
def test_outsiders_get_nothing_of_acme_from_any_route(kind, acme, world):
    client = _outsider(kind, world)
    before = _acme_state()
    problems: list[str] = []
    requested = 0
    for route in all_routes():
        try:
            path = fill(route, acme.objects)
        except CannotFill as exc:
            problems.append(f"cannot fill: {exc}")
            continue
        if path in ("/logout/", "/admin/logout/"):
            continue  # would end the outsider's session half-way through the sweep
        object_route = bool(set(route.params) - {"app_label", "url", "rest", "code", "ms"})
        methods = ["post"] if route.is_admin else ["post", "put", "patch", "delete"]
        # Writes first: if one slipped through, the reads after it would show it.
        for method in [*methods, "get"]:
            data, content_type = _write_data(route, acme, world) if method != "get" else ({}, None)
            if content_type:
                response = getattr(client, method)(path, data=json.dumps(data), content_type=content_type)
            elif method == "get":
                response = client.get(path)
            elif method == "post":
                response = client.post(path, data=data)
            else:
                response = getattr(client, method)(path)
            requested += 1
            status = response.status_code
            text = (
                response.content.decode(errors="replace")
                + "\n"
                + "\n".join(f"{k}: {v}" for k, v in response.items() if k.lower() != "location")
            )
            where = f"{method.upper()} {path} -> {status}"
            if status >= 500 and not (path == "/healthz" and status == 503):  # 503: no worker runs here
                problems.append(f"{where}: server error")
            if leaked := _leaks(text, acme):
                problems.append(f"{where}: shows {leaked}")
            if object_route and status not in OBJECT_STATUSES:
                problems.append(f"{where}: an acme object's route must answer 404/403/302")
            foreign_api_path = route.is_api and "tenant_id" in route.params and kind != "anonymous"
            if foreign_api_path and status != 404 and not (method != "get" and status == 405):
                problems.append(f"{where}: another tenant's API path must answer 404")
    assert requested > 150
    assert _acme_state() == before, "an outsider changed acme's data"
    assert not problems, f"{kind}:\n" + "\n".join(problems)
