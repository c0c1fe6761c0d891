"""Connections (docs/connections.md), end to end through the API and the real execution path
(workers.pipeline.run_now), against a real OAuth2 token endpoint and a target on 127.0.0.1
(tests/support/oauth.py): the token fetched once and shared until it expires, fetched again
after a 401 within the same attempt (both tries in the attempt log), a token endpoint that is
down failing the attempt with CredentialError under the call's retry policy, a rotation taking
effect at the next attempt, basic and API-key headers; no secret or token stored or shown
anywhere; a connection in use not deleted; bad input a 400 naming the field, storing nothing."""

from __future__ import annotations

import base64
import json
import time

import pytest
from django.test import Client

from core.secrets import REDACTED
from execution.credentials import tokens_forget
from execution.models import Connection, ConnectionToken, HttpExecution
from orchestration.models import ServiceCall
from orchestration.services import CallKey
from outbox.models import OutboxEvent
from tests.support.factories import make_call
from tests.support.oauth import oauth_world
from tests.support.schedules import make_schedule
from workers.pipeline import run_now

CONNECTIONS = "/api/tenants/{}/connections"


def api(key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def run(call: ServiceCall) -> ServiceCall:
    assert run_now([CallKey(call.tenant_id, call.pk)], worker_id="connections") == 1
    return ServiceCall.objects.get(pk=call.pk)


def create(client: Client, tenant: str, body: dict):
    return client.post(CONNECTIONS.format(tenant), body, content_type="application/json")


def oauth_connection(world, name: str = "billing", **extra) -> dict:
    return {
        "name": name,
        "kind": "oauth2ClientCredentials",
        "tokenUrl": world.token_url,
        "clientId": world.client_id,
        "clientSecret": world.client_secret,
        **extra,
    }


def everything_stored() -> str:
    """What the database holds that a person or a subscriber may see."""
    return json.dumps(
        [
            list(HttpExecution.objects.values()),
            list(ServiceCall.objects.values("request_spec", "outcome_meta")),
            list(OutboxEvent.objects.values("event_payload")),
            list(Connection.objects.values("name", "config")),
        ],
        default=str,
    )


@pytest.mark.django_db(transaction=True)
def test_an_oauth2_connection_fetches_a_token_once_shares_it_and_refreshes_it_after_expiry_and_a_401(world):
    client = api(world.acme_key)
    with oauth_world() as auth:
        answer = create(client, "acme", oauth_connection(auth, scope="invoices:write  invoices:read", audience="api"))
        assert answer.status_code == 201, answer.content
        shown = answer.json()
        assert auth.client_secret not in answer.content.decode()
        assert shown["scope"] == "invoices:write invoices:read" and shown["clientAuth"] == "basic"
        assert answer["Location"].endswith("/connections/billing")

        first = run(make_call(method="POST", url=auth.url(), body={"n": 1}, connection="billing"))
        second = run(make_call(url=auth.url(), connection="billing"))
        assert [first.status, second.status] == ["Succeeded", "Succeeded"]
        # One token for both: fetched once (client id and secret in HTTP Basic), asked for the scope
        # and the audience.
        assert len(auth.token_requests) == 1
        asked = auth.token_requests[0]
        assert asked["basic"] and asked["form"]["scope"] == ["invoices:write invoices:read"]
        assert asked["form"]["audience"] == ["api"]
        tokens = [r["headers"]["Authorization"] for r in auth.received]
        assert tokens[0] == tokens[1] and tokens[0].startswith("Bearer tok-")
        # The attempt log names the connection; the header it set is redacted; the echo is scrubbed.
        logged = HttpExecution.objects.get(service_call_id=first.pk)
        assert logged.connection_name == "billing" and logged.request_headers["Authorization"] == REDACTED
        assert first.outcome_meta["responseMeta"]["bodySnippet"] == json.dumps({"you sent": f"Bearer {REDACTED}"})

        # The target stops taking the token: a 401, the token fetched again, the request sent again,
        # in the same attempt; the attempt log shows the earlier try.
        auth.revoked.add(tokens[0][7:])
        third = run(make_call(method="PUT", url=auth.url(), body="x", connection="billing"))
        assert third.status == "Succeeded" and third.attempts == 1
        assert len(auth.token_requests) == 2 and [r["ok"] for r in auth.received[-2:]] == [False, True]
        detail = client.get(f"/api/tenants/acme/service-calls/{third.pk}").json()
        [attempt] = detail["executions"]
        assert attempt["connection"] == "billing" and attempt["response"]["status"] == 200
        assert [t["status"] for t in attempt["earlierTries"]] == [401]

        # A token that expires is not used after it: a short-lived one is fetched anew.
        auth.expires_in = 2
        ConnectionToken.objects.all().delete()
        tokens_forget()
        run(make_call(url=auth.url(), connection="billing"))
        fetched = len(auth.token_requests)
        time.sleep(2.1)
        assert run(make_call(url=auth.url(), connection="billing")).status == "Succeeded"
        assert len(auth.token_requests) == fetched + 1

        # Another process (here: this one, forgetting what it holds) takes the stored token.
        tokens_forget()
        assert run(make_call(url=auth.url(), connection="billing")).status == "Succeeded"
        assert len(auth.token_requests) == fetched + 1

        issued = list(auth.issued)
    stored = everything_stored()
    assert auth.client_secret not in stored and not any(token in stored for token in issued)


@pytest.mark.django_db(transaction=True)
def test_a_token_endpoint_that_is_down_fails_the_attempt_with_credential_error_retried_under_the_policy(world):
    client = api(world.acme_key)
    with oauth_world() as auth:
        assert create(client, "acme", oauth_connection(auth, clientAuth="body")).status_code == 201
        auth.down = True
        call = make_call(url=auth.url(), connection="billing", retry_policy={"maxAttempts": 2, "minBackoffMs": 100})
        waiting = run(call)
        assert waiting.status == "Scheduled" and waiting.attempts == 1 and auth.received == []
        failed = HttpExecution.objects.get(service_call_id=call.pk, attempt=1)
        assert failed.error_kind == "CredentialError"
        assert "token endpoint answered 503" in failed.error_message
        # Back up: the retry gets a token (the client's id and secret in the body this time).
        auth.down = False
        time.sleep(0.3)
        done = run(call)
        assert done.status == "Succeeded" and done.attempts == 2
        assert not auth.token_requests[-1]["basic"] and auth.token_requests[-1]["secret"] == auth.client_secret

        # A client the endpoint refuses: CredentialError saying what the endpoint said, nothing sent.
        client.patch(
            CONNECTIONS.format("acme") + "/billing", {"clientSecret": "wrong"}, content_type="application/json"
        )
        sent = len(auth.received)
        refused = run(make_call(url=auth.url(), connection="billing"))
        assert refused.status == "Failed" and refused.error_kind == "CredentialError"
        assert "invalid_client" in refused.outcome_meta["errorMeta"]["message"] and len(auth.received) == sent
        # The rotation back takes effect for the next attempt: the token fetched with the new secret.
        client.patch(
            CONNECTIONS.format("acme") + "/billing",
            {"clientSecret": auth.client_secret},
            content_type="application/json",
        )
        assert run(make_call(url=auth.url(), connection="billing")).status == "Succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_token_of_many_kib_is_read_whole_and_one_past_the_bound_is_a_credential_error(world):
    with oauth_world() as auth:
        assert create(api(world.acme_key), "acme", oauth_connection(auth)).status_code == 201
        auth.token_padding = 20_000
        assert run(make_call(url=auth.url(), connection="billing")).status == "Succeeded"
        assert len(auth.received[-1]["headers"]["Authorization"]) > 20_000
        ConnectionToken.objects.all().delete()
        tokens_forget()
        auth.token_padding = 70_000
        failed = run(make_call(url=auth.url(), connection="billing"))
        assert failed.error_kind == "CredentialError" and "too long" in failed.outcome_meta["errorMeta"]["message"]


@pytest.mark.django_db(transaction=True)
def test_basic_and_api_key_connections_set_their_headers_and_never_show_the_secret(world, http_target):
    client = api(world.acme_key)
    assert (
        create(
            client, "acme", {"name": "legacy", "kind": "basic", "username": "agent", "password": "pw-9z"}
        ).status_code
        == 201
    )
    answer = create(
        client, "acme", {"name": "crm", "kind": "apiKeyHeader", "headerName": "X-Client", "headerValue": "k-77q1"}
    )
    assert answer.status_code == 201 and "k-77q1" not in answer.content.decode()
    with oauth_world() as auth:
        run(make_call(url=auth.url(), connection="legacy"))
        run(make_call(url=auth.url(), connection="crm", headers={"X-Other": "1"}))
        basic, keyed = auth.received
    assert basic["headers"]["Authorization"] == "Basic " + base64.b64encode(b"agent:pw-9z").decode()
    # The target echoed the credential, encoded and decoded: scrubbed from the stored answer.
    echoed = ServiceCall.objects.get(pk=HttpExecution.objects.get(connection_name="legacy").service_call_id)
    assert json.loads(echoed.outcome_meta["errorMeta"]["bodySnippet"])["decoded"] == REDACTED
    assert keyed["headers"]["X-Client"] == "k-77q1" and keyed["headers"]["X-Other"] == "1"
    logged = HttpExecution.objects.get(connection_name="crm")
    assert logged.request_headers["X-Client"] == REDACTED
    listed = client.get(CONNECTIONS.format("acme")).json()["results"]
    assert [c["name"] for c in listed] == ["crm", "legacy"] and listed[0]["headerName"] == "X-Client"
    stored = everything_stored() + json.dumps(listed)
    assert "pw-9z" not in stored and "k-77q1" not in stored


@pytest.mark.django_db(transaction=True)
def test_a_connection_in_use_is_not_deleted_and_a_deleted_one_fails_the_attempt(world):
    client = api(world.acme_key)
    assert (
        create(
            client, "acme", {"name": "crm", "kind": "apiKeyHeader", "headerName": "X-Key", "headerValue": "v"}
        ).status_code
        == 201
    )
    call = make_call(url="http://127.0.0.1:9/", connection="crm", due_in=3600)
    schedule = make_schedule("acme", name="nightly", cron="0 3 * * *", url="http://127.0.0.1:9/", connection="crm")
    refused = client.delete(CONNECTIONS.format("acme") + "/crm")
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert f"call {call.pk}" in detail and "schedule 'nightly'" in detail and str(schedule.pk) in detail
    assert Connection.objects.filter(name="crm").exists()
    # The schedule deleted and the call cancelled, nothing live names it: deleted.
    client.delete(f"/api/tenants/acme/schedules/{schedule.pk}")
    assert client.post(f"/api/tenants/acme/service-calls/{call.pk}/cancel").status_code == 200
    assert client.delete(CONNECTIONS.format("acme") + "/crm").status_code == 204
    # A call made while a delete ran (the row gone under it, as a race leaves it) fails its attempt.
    create(client, "acme", {"name": "crm", "kind": "apiKeyHeader", "headerName": "X-Key", "headerValue": "v"})
    late = make_call(url="http://127.0.0.1:9/", connection="crm")
    Connection.objects.filter(name="crm").delete()
    orphan = run(late)
    assert orphan.status == "Failed" and orphan.error_kind == "CredentialError"
    assert "does not exist" in orphan.outcome_meta["errorMeta"]["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "kind": "digest", "username": "u", "password": "p"}, "kind"),
        ({"name": "x y", "kind": "basic", "username": "u", "password": "p"}, "name"),
        ({"name": "x", "kind": "basic", "username": "u:v", "password": "p"}, "username"),
        ({"name": "x", "kind": "basic", "username": "u"}, "password"),
        ({"name": "x", "kind": "basic", "username": "u", "password": "p", "tokenUrl": "http://a/"}, "tokenUrl"),
        ({"name": "x", "kind": "apiKeyHeader", "headerName": "Bad Name", "headerValue": "v"}, "headerName"),
        ({"name": "x", "kind": "apiKeyHeader", "headerName": "Host", "headerValue": "v"}, "headerName"),
        ({"name": "x", "kind": "apiKeyHeader", "headerName": "X-K", "headerValue": "a\r\nb"}, "headerValue"),
        (
            {
                "name": "x",
                "kind": "oauth2ClientCredentials",
                "tokenUrl": "ftp://a/",
                "clientId": "c",
                "clientSecret": "s",
            },
            "tokenUrl",
        ),
        ({"name": "x", "kind": "oauth2ClientCredentials", "tokenUrl": "https://a/t", "clientSecret": "s"}, "clientId"),
        (
            {
                "name": "x",
                "kind": "oauth2ClientCredentials",
                "tokenUrl": "https://a/t",
                "clientId": "c",
                "clientSecret": "s",
                "clientAuth": "jwt",
            },
            "clientAuth",
        ),
        (
            {
                "name": "x",
                "kind": "oauth2ClientCredentials",
                "tokenUrl": "http://169.254.169.254/latest/meta-data/",
                "clientId": "c",
                "clientSecret": "s",
            },
            "tokenUrl",
        ),
        ([1], "body"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(world, body, field):
    answer = create(api(world.acme_key), "acme", body)
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"]
    assert not Connection.objects.exists()


def test_calls_and_schedules_name_only_their_tenants_connections_and_leave_its_header_alone(world):
    acme, globex = api(world.acme_key), api(world.globex_key)
    assert (
        create(
            acme, "acme", {"name": "crm", "kind": "apiKeyHeader", "headerName": "X-Key", "headerValue": "v"}
        ).status_code
        == 201
    )
    spec = {"method": "GET", "url": "http://127.0.0.1:9/", "connection": "crm"}
    # globex has no connection "crm": acme's is not its to use, see, change or delete.
    answer = globex.post(
        "/api/tenants/globex/service-calls", {"name": "c", "requestSpec": spec}, content_type="application/json"
    )
    assert answer.status_code == 400 and "requestSpec.connection" in answer.json()["errors"]
    assert globex.get(CONNECTIONS.format("globex")).json() == {"results": []}
    for method in ("get", "patch", "delete"):
        assert getattr(globex, method)(CONNECTIONS.format("globex") + "/crm").status_code == 404
        assert getattr(globex, method)(CONNECTIONS.format("acme") + "/crm").status_code == 404
    # The request may not set the header the connection sets (any spelling).
    clash = {**spec, "headers": {"x_key": "mine"}}
    answer = acme.post(
        "/api/tenants/acme/service-calls", {"name": "c", "requestSpec": clash}, content_type="application/json"
    )
    assert answer.status_code == 400 and "requestSpec.headers" in answer.json()["errors"]
    schedule = {"name": "s", "cron": "0 3 * * *", "requestSpec": {**spec, "connection": "nope"}}
    answer = acme.post("/api/tenants/acme/schedules", schedule, content_type="application/json")
    assert answer.status_code == 400 and "requestSpec.connection" in answer.json()["errors"]
    assert not ServiceCall.objects.exists()
    # Accepted: the request spec shows the connection's name.
    answer = acme.post(
        "/api/tenants/acme/service-calls", {"name": "c", "requestSpec": spec}, content_type="application/json"
    )
    assert answer.status_code == 202 and answer.json()["requestSpec"]["connection"] == "crm"
    # The name and the kind stay; an unknown field for the kind is refused.
    for change, field in (({"name": "other"}, "name"), ({"kind": "basic"}, "kind"), ({"password": "p"}, "password")):
        answer = acme.patch(CONNECTIONS.format("acme") + "/crm", change, content_type="application/json")
        assert answer.status_code == 400 and field in answer.json()["errors"]


@pytest.mark.django_db(transaction=True)
def test_a_broken_or_hostile_token_endpoint_is_a_credential_error_and_another_scope_is_taken(world):
    with oauth_world() as auth:
        assert create(api(world.acme_key), "acme", oauth_connection(auth, scope="a")).status_code == 201
        auth.granted_scope = "a b"  # more than asked for: the endpoint decides
        assert run(make_call(url=auth.url(), connection="billing")).status == "Succeeded"
        for answer in (
            "[1, 2]",
            '{"access_token": "x", "token_type": "Bearer", "expires_in": 1e400}',
            '{"access_token": "bad token\r\nX-Injected: 1", "token_type": "Bearer"}',
            '{"access_token": {"nested": 1}, "token_type": "Bearer"}',
            '{"access_token": "x", "token_type": "mac"}',
            "<html>sign in</html>",
        ):
            ConnectionToken.objects.all().delete()
            tokens_forget()
            auth.answer = answer
            sent = len(auth.received)
            failed = run(make_call(url=auth.url(), connection="billing"))
            assert failed.error_kind == "CredentialError", (answer, failed.outcome_meta)
            assert len(auth.received) == sent, answer  # nothing went to the target


@pytest.mark.django_db(transaction=True)
def test_the_token_fetch_and_the_sends_share_the_attempts_one_deadline(world):
    with oauth_world() as auth:
        assert create(api(world.acme_key), "acme", oauth_connection(auth)).status_code == 201
        auth.delay = 1.5
        started = time.monotonic()
        failed = run(make_call(url=auth.url(), connection="billing", timeout_ms=500))
        assert time.monotonic() - started < 1.4
        assert failed.error_kind == "CredentialError" and auth.received == []


def test_a_new_token_url_takes_the_client_secret_again_and_odd_characters_are_refused(world):
    client = api(world.acme_key)
    body = {
        "name": "billing",
        "kind": "oauth2ClientCredentials",
        "tokenUrl": "https://auth.example.com/t",
        "clientId": "c",
        "clientSecret": "s",
    }
    assert create(client, "acme", body).status_code == 201
    moved = client.patch(
        CONNECTIONS.format("acme") + "/billing",
        {"tokenUrl": "https://evil.example.net/t"},
        content_type="application/json",
    )
    assert moved.status_code == 400 and "clientSecret" in moved.json()["errors"]
    assert Connection.objects.get().config["tokenUrl"] == "https://auth.example.com/t"
    for field in ("username", "password"):
        raw = '{"name": "x", "kind": "basic", "username": "u", "password": "p"}'.replace(
            f'"{field}": "{field[0]}"', f'"{field}": "\\ud800"'
        )
        answer = client.post(CONNECTIONS.format("acme"), raw, content_type="application/json")
        assert answer.status_code == 400 and field in answer.json()["errors"], answer.content
    hooked = {"name": "h", "kind": "apiKeyHeader", "headerName": "webhook-signature", "headerValue": "v"}
    assert "headerName" in create(client, "acme", hooked).json()["errors"]
