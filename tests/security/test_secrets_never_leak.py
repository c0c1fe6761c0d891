"""Secret header values reach the target and nothing else (docs/security.md §4, "Secrets").

A call is submitted through the API with secret headers, run by the engine against a real
target that echoes what it got, and run again; then every API response, every page and admin
page (all routes of the URLconf), every row of every table (django-q's included, decoded),
the raw database files and every log line are searched for the plaintext values: zero hits.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client, override_settings

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.factories import make_user
from tests.support.routes import AcmeObjects, all_routes, fill
from tests.support.sqlite_files import read_bytes_elsewhere
from tests.support.subscriptions import make_subscription
from tests.support.waiting import wait_for

SECRETS = {
    "Authorization": "Bearer s3cr3t-authz-Z9Q1w7",
    "Cookie": "sid=s3cr3t-cookie-X7e2",
    "X-Api-Key": "s3cr3t-apikey-K2m4",
    "X-Auth-Token": "s3cr3t-token-T8p3",
    "X-Client-Secret": "s3cr3t-secret-S1n5",
    "X-Db-Password": "s3cr3t-password-P5v6",
    "X-Signature": "s3cr3t-signature-G4h8",  # secret only through SECRET_HEADER_PATTERNS
}
PATTERNS = ["authorization", "cookie", "token", "secret", "key", "password", "signature"]
# A connection's header value (docs/connections.md), under a name no pattern calls secret: it is
# redacted because a connection set it.
CONNECTION_HEADER = ("X-Partner", "s3cr3t-connection-C6r2")


class _Capture(logging.Handler):
    """Every record of every logger, formatted as the product formats it, with its extras."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        from core.logging import JsonFormatter

        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def captured_logs():
    handler = _Capture()
    names = [
        "",
        "django",
        "django_q",
        "serviceagent",
        "serviceagent.events",
        "orchestration",
        "execution",
        "outbox",
        "workers",
        "timer",
        "eventservice",
    ]
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def _leaks(text: str) -> list[str]:
    return [
        value
        for value in (*SECRETS.values(), CONNECTION_HEADER[1])
        if value in text or value.split("=")[-1] in text or value.removeprefix("Bearer ") in text
    ]


def _api(key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def _finished(pk):
    call = ServiceCall.objects.get(pk=pk)
    return call if call.is_terminal else None


def _database_dump() -> list[str]:
    """Every value of every row of every table, read with a separate sqlite3 connection."""
    path = connection.settings_dict["NAME"]
    raw = sqlite3.connect(path)
    try:
        tables = [row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        values = []
        for table in tables:
            for row in raw.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, bytes):
                        values.append(value.decode("latin-1"))
                    elif value is not None:
                        values.append(str(value))
        return [f"tables: {', '.join(tables)}", *values]
    finally:
        raw.close()


def _django_q_decoded() -> list[str]:
    """django-q keeps task arguments pickled (and compressed): decode them before searching."""
    from django_q.models import OrmQ, Task
    from django_q.signing import SignedPackage

    texts = [repr(SignedPackage.loads(q.payload)) for q in OrmQ.objects.all()]
    texts += [repr((t.func, t.args, t.kwargs, t.result)) for t in Task.objects.all()]
    return texts


@override_settings(SECRET_HEADER_PATTERNS=PATTERNS)
def test_secret_header_values_reach_the_target_and_appear_nowhere_else(
    world, http_target, engine, captured_logs, client
):
    api = _api(world.acme_key)
    # A webhook subscription (nothing listens at its URL): the call's events fan out to it, so
    # the delivery routes and pages below show acme's real deliveries of them.
    make_subscription("acme", name="sweep hook")
    headers = {**SECRETS, "X-Visible": "plain-value-1"}
    made = api.post(
        "/api/tenants/acme/connections",
        content_type="application/json",
        data={
            "name": "partner",
            "kind": "apiKeyHeader",
            "headerName": CONNECTION_HEADER[0],
            "headerValue": CONNECTION_HEADER[1],
        },
    )
    assert made.status_code == 201, made.content
    # A recurring schedule with the same headers: its row, and the call it makes ahead for New
    # Year, hold them sealed; its API answers, pages and admin pages are swept below.
    schedule = api.post(
        "/api/tenants/acme/schedules",
        content_type="application/json",
        data={
            "name": "secret schedule",
            "cron": "0 0 1 1 *",
            "requestSpec": {"method": "POST", "url": http_target.url("/echo"), "headers": headers},
        },
    )
    assert schedule.status_code == 201, schedule.content
    response = api.post(
        "/api/tenants/acme/service-calls",
        content_type="application/json",
        data={
            "name": "secret call",
            "requestSpec": {
                "method": "POST",
                "url": http_target.url("/echo"),
                "headers": headers,
                "body": {"x": 1},
                "connection": "partner",
            },
            "tags": ["s"],
        },
    )
    assert response.status_code == 202, response.content
    call_id = response.json()["serviceCallId"]
    done = wait_for(lambda: _finished(call_id), timeout=10)
    assert done.status == ServiceCall.Status.SUCCEEDED

    # The target received every real value.
    received = http_target.requests[-1]["headers"]
    for name, value in SECRETS.items():
        assert received[name] == value
    assert received[CONNECTION_HEADER[0]] == CONNECTION_HEADER[1]

    # A rerun still sends them: sealed values were kept, not lost to redaction.
    rerun = api.post(f"/api/tenants/acme/service-calls/{call_id}/rerun")
    assert rerun.status_code == 202, rerun.content
    rerun_id = rerun.json()["serviceCallId"]
    assert wait_for(lambda: _finished(rerun_id), timeout=10).status == ServiceCall.Status.SUCCEEDED
    assert http_target.requests[-1]["headers"]["Authorization"] == SECRETS["Authorization"]
    wait_for(lambda: not OutboxEvent.objects.filter(published_at__isnull=True).exists(), timeout=10)

    # What the API shows.
    shown = [response.content.decode(), rerun.content.decode(), schedule.content.decode(), made.content.decode()]
    for path in (
        f"/api/tenants/acme/service-calls/{call_id}",
        f"/api/tenants/acme/service-calls/{rerun_id}",
        "/api/tenants/acme/service-calls",
        "/api/tenants/acme/events?limit=200",
    ):
        got = api.get(path)
        assert got.status_code == 200, path
        shown.append(got.content.decode())
    detail = json.loads(shown[2])
    assert detail["requestSpec"]["headers"]["X-Visible"] == "plain-value-1"
    assert {detail["requestSpec"]["headers"][name] for name in SECRETS} == {"***"}

    # Every page as the owner and every admin page as a superuser, with acme's ids filled in.
    user_model = get_user_model()
    make_user("root", superuser=True)
    owner, admin = Client(), Client()
    owner.force_login(world.owner)
    admin.force_login(user_model.objects.get(username="root"))
    acme = AcmeObjects(call=call_id, other_call=rerun_id, extra={"name": "partner"})
    routes = all_routes()
    assert len(routes) > 50
    statuses = {}
    for route in routes:
        path = fill(route, acme)
        page = (admin if route.is_admin else owner).get(path)
        assert page.status_code < 500, path
        statuses[path] = page.status_code
        shown.append(f"{path}\n{page.content.decode(errors='replace')}")
    # The pages that show the request did show it (redacted), so the search meant something.
    for path in (f"/calls/{call_id}/", f"/admin/orchestration/servicecall/{call_id}/change/"):
        assert statuses[path] == 200
        assert "plain-value-1" in next(text for text in shown if text.startswith(path + "\n"))
    assert not [(text[:80], _leaks(text)) for text in shown if _leaks(text)]

    # Nothing at rest: rows of every table, django-q's decoded payloads, the raw files.
    dump = _database_dump()
    assert "service_calls" in dump[0] and "outbox" in dump[0] and "django_q_ormq" in dump[0]
    assert not [value[:80] for value in dump if _leaks(value)]
    assert not [text[:80] for text in _django_q_decoded() if _leaks(text)]
    for suffix in ("", "-wal"):
        file = Path(connection.settings_dict["NAME"] + suffix)
        if file.exists():
            raw = read_bytes_elsewhere(file)
            assert not [value for value in (*SECRETS.values(), CONNECTION_HEADER[1]) if value.encode() in raw], file

    # Nothing in any log line (the engine's, the dispatcher's event log, the API's).
    assert captured_logs.lines, "the capture saw no log line at all"
    assert not [line[:120] for line in captured_logs.lines if _leaks(line)]
