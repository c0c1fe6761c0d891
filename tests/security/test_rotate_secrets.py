"""manage.py rotate_secrets: re-encrypt sealed header values under the first key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command

from core.secrets import SEALED, derived_key, unseal_headers
from orchestration.models import ServiceCall
from tests.support.factories import make_call

OLD = Fernet.generate_key().decode()
NEW = Fernet.generate_key().decode()
OTHER = Fernet.generate_key().decode()


def _token(call: ServiceCall, header: str) -> bytes:
    return ServiceCall.objects.get(pk=call.pk).request_spec["headers"][header][SEALED].encode()


def _run(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("rotate_secrets", *args, stdout=out)
    return out.getvalue()


def test_it_re_encrypts_every_sealed_value_under_the_first_key(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    first = make_call(name="one", headers={"Authorization": "Bearer one-111", "X-Plain": "p"})
    second = make_call(name="two", headers={"X-Api-Key": "two-222", "Cookie": "c=333"})
    plain = make_call(name="three", headers={"Accept": "text/plain"})
    settings.FIELD_ENCRYPTION_KEYS = [NEW, OLD]
    output = _run()
    assert "Examined 3 calls; re-encrypted the secrets of 2." in output
    new = Fernet(NEW.encode())
    assert new.decrypt(_token(first, "Authorization")) == b"Bearer one-111"
    assert new.decrypt(_token(second, "X-Api-Key")) == b"two-222"
    assert new.decrypt(_token(second, "Cookie")) == b"c=333"
    with pytest.raises(InvalidToken):
        Fernet(OLD.encode()).decrypt(_token(first, "Authorization"))
    assert ServiceCall.objects.get(pk=first.pk).request_spec["headers"]["X-Plain"] == "p"
    assert ServiceCall.objects.get(pk=plain.pk).request_spec["headers"] == {"Accept": "text/plain"}
    # The old key can now be dropped.
    settings.FIELD_ENCRYPTION_KEYS = [NEW]
    assert unseal_headers(ServiceCall.objects.get(pk=first.pk).request_spec["headers"])["Authorization"] == (
        "Bearer one-111"
    )


def test_a_second_run_leaves_values_already_under_the_first_key(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    call = make_call(name="one", headers={"Authorization": "Bearer one-111"})
    settings.FIELD_ENCRYPTION_KEYS = [NEW, OLD]
    _run()
    token = _token(call, "Authorization")
    assert "re-encrypted the secrets of 0." in _run()
    assert _token(call, "Authorization") == token


def test_it_moves_values_sealed_with_the_derived_key_to_configured_keys(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = []
    call = make_call(name="derived", headers={"X-Auth-Token": "derived-444"})
    settings.FIELD_ENCRYPTION_KEYS = [NEW, derived_key(settings.SECRET_KEY).decode()]
    _run()
    assert Fernet(NEW.encode()).decrypt(_token(call, "X-Auth-Token")) == b"derived-444"


def test_dry_run_changes_nothing(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    call = make_call(name="one", headers={"Authorization": "Bearer one-111"})
    token = _token(call, "Authorization")
    settings.FIELD_ENCRYPTION_KEYS = [NEW, OLD]
    assert "would re-encrypt the secrets of 1." in _run("--dry-run")
    assert _token(call, "Authorization") == token


def test_it_fails_and_keeps_values_no_configured_key_decrypts(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = [OTHER]
    lost = make_call(name="lost", headers={"Authorization": "Bearer lost-555"})
    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    kept = make_call(name="kept", headers={"Authorization": "Bearer kept-666"})
    token = _token(lost, "Authorization")
    settings.FIELD_ENCRYPTION_KEYS = [NEW, OLD]
    with pytest.raises(CommandError, match=rf"1 stored secrets cannot be decrypted .* call {lost.pk}"):
        _run()
    assert _token(lost, "Authorization") == token
    assert Fernet(NEW.encode()).decrypt(_token(kept, "Authorization")) == b"Bearer kept-666"


def test_it_refuses_a_batch_size_below_one(world):
    with pytest.raises(CommandError, match="batch-size"):
        _run("--batch-size", "0")


def test_it_works_in_small_batches(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    calls = [make_call(name=f"c{i}", headers={"X-Api-Key": f"key-{i}-000"}) for i in range(5)]
    settings.FIELD_ENCRYPTION_KEYS = [NEW, OLD]
    assert "Examined 5 calls; re-encrypted the secrets of 5." in _run("--batch-size", "2")
    assert [Fernet(NEW.encode()).decrypt(_token(c, "X-Api-Key")) for c in calls] == [
        f"key-{i}-000".encode() for i in range(5)
    ]


def test_its_help_describes_the_procedure():
    result = subprocess.run(
        [sys.executable, "manage.py", "rotate_secrets", "--help"],
        capture_output=True,
        text=True,
        cwd=Path(django_settings.BASE_DIR),
        env={"DJANGO_SETTINGS_MODULE": "eventservice.settings_test", "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "FIELD_ENCRYPTION_KEYS" in result.stdout and "--dry-run" in result.stdout


def test_it_rotates_the_schedules_secrets_too(world, settings):
    from schedules.models import Schedule
    from tests.support.schedules import make_schedule

    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    schedule = make_schedule(headers={"Authorization": "Bearer sched-secret"})
    settings.FIELD_ENCRYPTION_KEYS = [NEW, OLD]
    output = _run()
    assert "Examined 1 schedules; re-encrypted the secrets of 1." in output
    token = Schedule.objects.get(pk=schedule.pk).request_spec["headers"]["Authorization"][SEALED]
    assert Fernet(NEW.encode()).decrypt(token.encode()) == b"Bearer sched-secret"


def test_the_signing_secrets_of_webhooks_and_of_signed_calls_are_re_encrypted_too(world, settings):
    """Removing the old key after the command must leave every webhook and every signed call able
    to sign, with the same secrets."""
    from datetime import UTC, datetime

    from standardwebhooks import Webhook

    from delivery.channels.webhook import webhook_signature
    from delivery.models import Subscription
    from execution.models import CallSigning
    from execution.signing import call_signing_set, signed
    from execution.wire import HttpRequest
    from tests.support.subscriptions import make_subscription

    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    hook, hook_secret = make_subscription("acme", url="http://127.0.0.1:9/hook")
    _, call_secret = call_signing_set(tenant_id="acme", enabled=True)
    call_signing_set(tenant_id="acme", enabled=True, rotate=True)  # the previous secret signs too
    settings.FIELD_ENCRYPTION_KEYS = [NEW, OLD]
    output = _run()
    assert "Examined 1 webhook subscriptions; re-encrypted the signing secrets of 1." in output
    assert "Examined 1 tenants' call signing; re-encrypted the secrets of 1." in output

    settings.FIELD_ENCRYPTION_KEYS = [NEW]
    at = datetime.now(UTC)
    hook = Subscription.objects.get(pk=hook.pk)
    header = webhook_signature(hook, msg_id="msg_1", at=at, body="{}")
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(at.timestamp())), "webhook-signature": header}
    Webhook(hook_secret).verify("{}", headers)
    row = CallSigning.objects.get(tenant_id="acme")
    assert Fernet(NEW.encode()).decrypt(row.previous_secret[SEALED].encode()) == call_secret.encode()
    request = signed(HttpRequest("POST", "http://127.0.0.1:9/", {}, "x", 1000), tenant_id="acme", msg_id="c.1", at=at)
    assert request.cannot_send is None
    Webhook(call_secret).verify(
        "x", request.agent_headers, json_parse=False
    )  # the previous secret's signature is among them


def test_the_connections_secrets_are_re_encrypted_and_their_tokens_forgotten(world, settings):
    """After the command and the old key's removal, each connection still gives its credentials."""
    from datetime import timedelta

    from core.ids import utcnow
    from core.secrets import seal_value
    from execution.connections import connection_create, validate_connection
    from execution.credentials import credentials_for
    from execution.models import Connection, ConnectionToken

    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    data = {"name": "crm", "kind": "apiKeyHeader", "headerName": "X-Key", "headerValue": "conn-444"}
    connection = connection_create(tenant_id="acme", data=validate_connection(data))
    now = utcnow()
    ConnectionToken.objects.create(
        connection=connection, version=1, token=seal_value("tok"), fetched_at=now, use_until=now + timedelta(hours=1)
    )
    settings.FIELD_ENCRYPTION_KEYS = [NEW, OLD]
    assert "Examined 1 connections; re-encrypted the secrets of 1." in _run()
    assert not ConnectionToken.objects.exists()

    settings.FIELD_ENCRYPTION_KEYS = [NEW]
    assert Fernet(NEW.encode()).decrypt(Connection.objects.get().secret[SEALED].encode()) == b"conn-444"
    [credential] = credentials_for([("acme", "crm")]).values()
    assert credential.problem is None and credential.value == "conn-444"
