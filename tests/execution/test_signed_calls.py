"""Signed calls (docs/api.md, "Signed calls"): with a tenant's signing on, a real target on
127.0.0.1 that verifies each request with the `standardwebhooks` package (the docs' own function)
accepts every attempt of its calls, whatever the method and body; it refuses them once signing is
off; a rotation signs with both secrets; a secret that cannot be unsealed fails the attempt and
sends nothing; bad input is a 400 naming the field; another tenant sees nothing of it. The calls
run through the real execution path (workers.pipeline.run_now)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from io import StringIO
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.test import Client

from execution.models import CallSigning, HttpExecution
from orchestration.models import ServiceCall
from orchestration.services import CallKey
from tests.support.factories import make_call
from tests.support.loopback import serving
from workers.pipeline import run_now

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
SIGNING = "/api/tenants/{}/signing"


def from_the_agent():
    """docs/api.md's verifying function, as a target would copy it."""
    section = DOC.read_text().split("## Signed calls", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace["from_the_agent"]


@dataclass
class VerifyingTarget:
    """Answers 204 to a request `from_the_agent` accepts under any of `secrets`, 401 otherwise."""

    port: int
    secrets: list[str] = field(default_factory=list)
    received: list[dict] = field(default_factory=list)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@contextmanager
def verifying_target() -> Iterator[VerifyingTarget]:
    verify = from_the_agent()
    lock = threading.Lock()
    target = VerifyingTarget(port=0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = dict(self.headers)
            verified = [secret for secret in target.secrets if verify(body, headers, secret)]
            with lock:
                target.received.append({"method": self.command, "body": body, "headers": headers, "by": verified})
            self.send_response(204 if verified else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    with serving(Handler) as port:
        target.port = port
        yield target


def run(call: ServiceCall) -> ServiceCall:
    assert run_now([CallKey(call.tenant_id, call.pk)], worker_id="signing") == 1
    return ServiceCall.objects.get(pk=call.pk)


def api(key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


@pytest.mark.django_db(transaction=True)
def test_a_target_verifying_with_standardwebhooks_accepts_every_signed_attempt_and_refuses_once_signing_is_off(world):
    client = api(world.acme_key)
    assert client.get(SIGNING.format("acme")).json() == {
        "enabled": False,
        "secretCreatedAt": None,
        "previousSecretSignsUntil": None,
    }
    answer = client.put(SIGNING.format("acme"), {"enabled": True}, content_type="application/json")
    assert answer.status_code == 200
    secret = answer.json()["secret"]
    assert secret.startswith("whsec_") and answer.json()["enabled"] is True
    assert answer["Cache-Control"] == "no-store"
    assert "secret" not in client.get(SIGNING.format("acme")).json()
    # Enabling again signs with the same secret, and does not show it.
    again = client.put(SIGNING.format("acme"), {"enabled": True}, content_type="application/json")
    assert "secret" not in again.json()

    with verifying_target() as target:
        target.secrets = [secret]
        posted = run(make_call(method="POST", url=target.url(), body={"order": 42, "name": "Zoë"}))
        fetched = run(make_call(method="GET", url=target.url("/hook?page=2")))
        text = run(make_call(method="PUT", url=target.url(), body="plain text, not JSON"))
        assert [c.status for c in (posted, fetched, text)] == ["Succeeded"] * 3
        assert [r["headers"]["webhook-id"] for r in target.received] == [f"{c.pk}.1" for c in (posted, fetched, text)]

        # Another tenant's calls are not signed.
        other = run(make_call("globex", method="POST", url=target.url(), body={"n": 1}))
        assert other.status == "Failed" and "webhook-signature" not in target.received[-1]["headers"]

        # Off: the target refuses the unsigned request.
        client.put(SIGNING.format("acme"), {"enabled": False}, content_type="application/json")
        refused = run(make_call(method="POST", url=target.url(), body={"n": 2}))
        assert refused.status == "Failed" and refused.error_kind == "HttpError"
        assert "webhook-signature" not in target.received[-1]["headers"]

        # On again, with the secret it had; then rotated: both secrets sign for 24 hours.
        client.put(SIGNING.format("acme"), {"enabled": True}, content_type="application/json")
        assert run(make_call(method="POST", url=target.url(), body={"n": 3})).status == "Succeeded"
        rotated = client.put(
            SIGNING.format("acme"), {"enabled": True, "rotateSecret": True}, content_type="application/json"
        ).json()
        new_secret = rotated["secret"]
        assert new_secret != secret and rotated["previousSecretSignsUntil"]
        target.secrets = [secret, new_secret]
        assert run(make_call(method="POST", url=target.url(), body={"n": 4})).status == "Succeeded"
        assert target.received[-1]["by"] == [secret, new_secret]
        assert len(target.received[-1]["headers"]["webhook-signature"].split(" ")) == 2

    # The secrets are never in an answer after the one that made them, nor in the attempt log.
    logged = str(list(HttpExecution.objects.values()))
    assert secret not in logged and new_secret not in logged
    assert secret not in str(client.get(SIGNING.format("acme")).json())


@pytest.mark.django_db(transaction=True)
def test_a_secret_that_cannot_be_unsealed_fails_the_attempt_and_sends_nothing(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    call_command("sign_calls", "acme", "--on", stdout=StringIO())
    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]  # the old key gone
    with verifying_target() as target:
        failed = run(make_call(method="POST", url=target.url(), body={"n": 1}))
        assert target.received == []
    assert failed.status == "Failed" and failed.error_kind == "InternalError"
    assert "signing secret cannot be unsealed" in failed.outcome_meta["errorMeta"]["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "enabled"),
        ({"enabled": "yes"}, "enabled"),
        ({"enabled": None}, "enabled"),
        ({"enabled": False, "rotateSecret": True}, "rotateSecret"),
        ({"enabled": True, "rotateSecret": 1}, "rotateSecret"),
        ({"enabled": True, "secret": "whsec_mine"}, "secret"),
        ([True], "body"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(world, body, field):
    answer = api(world.acme_key).put(SIGNING.format("acme"), body, content_type="application/json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"], answer.json()
    assert not CallSigning.objects.exists()


def test_an_empty_body_is_a_400(world):
    answer = api(world.acme_key).put(SIGNING.format("acme"), "", content_type="application/json")
    assert answer.status_code == 400 and "body" in answer.json()["errors"]
    assert not CallSigning.objects.exists()


def test_another_tenant_neither_reads_nor_changes_it(world):
    api(world.acme_key).put(SIGNING.format("acme"), {"enabled": True}, content_type="application/json")
    outsider = api(world.globex_key)
    assert outsider.get(SIGNING.format("acme")).status_code == 404
    assert outsider.put(SIGNING.format("acme"), {"enabled": False}, content_type="application/json").status_code == 404
    assert CallSigning.objects.get(tenant_id="acme").enabled


def test_the_command_turns_it_on_shows_the_secret_once_rotates_and_turns_it_off(world):
    def sign(*args: str) -> str:
        out = StringIO()
        call_command("sign_calls", "acme", *args, stdout=out)
        return out.getvalue()

    assert sign() == "Calls of acme: not signed.\n"
    with pytest.raises(CommandError, match="sign them first"):
        sign("--rotate")
    first = sign("--on")
    assert re.search(r"Signing secret \(shown once, keep it now\): whsec_\S+", first) and "signed." in first
    assert "whsec_" not in sign("--on")
    rotated = sign("--rotate")
    assert "whsec_" in rotated and "The previous secret signs too until" in rotated
    assert sign("--off").startswith("Calls of acme: not signed.")
    with pytest.raises(CommandError):
        call_command("sign_calls", "no-such-tenant", "--on", stdout=StringIO())


def test_the_page_turns_it_on_and_shows_the_secret_once(world, client):
    client.force_login(world.member)
    page = client.get("/signing/")
    assert page.status_code == 200 and b"Sign my calls" in page.content
    done = client.post("/signing/", {"action": "enable"})
    assert done.status_code == 302
    shown = client.get("/signing/").content.decode()
    [secret] = re.findall(r"whsec_[A-Za-z0-9+/=]{20,}", shown)
    assert "Rotate secret" in shown
    assert secret not in client.get("/signing/").content.decode()
    client.post("/signing/", {"action": "rotate"})
    assert "signs too until" in client.get("/signing/").content.decode()
    client.post("/signing/", {"action": "disable"})
    assert not CallSigning.objects.get(tenant_id="acme").enabled
    assert client.post("/signing/", {"action": "explode"}).status_code == 302
    assert not CallSigning.objects.get(tenant_id="acme").enabled


def test_the_admin_adds_it_with_the_secret_shown_once_and_rotates_it(world, admin_client):
    added = admin_client.post("/admin/execution/callsigning/add/", {"tenant": "acme"})
    assert added.status_code == 200
    [secret] = re.findall(r"whsec_[A-Za-z0-9+/=]{20,}", added.content.decode())
    assert CallSigning.objects.get(tenant_id="acme").enabled
    rotated = admin_client.post(
        "/admin/execution/callsigning/", {"action": "rotate_secret", "_selected_action": ["acme"]}
    )
    [new] = re.findall(r"whsec_[A-Za-z0-9+/=]{20,}", rotated.content.decode())
    assert new != secret
    assert secret not in admin_client.get("/admin/execution/callsigning/acme/change/").content.decode()
