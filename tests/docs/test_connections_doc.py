"""docs/connections.md stays true: its connections are made as written (none answers its secret),
its call is accepted naming one, the OAuth2 one runs for real against a token endpoint on
127.0.0.1, its commands run as written, and its figures are the code's."""

from __future__ import annotations

import io
import json
import re
import shlex
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command

from execution import connections, credentials
from orchestration.models import ServiceCall
from orchestration.services import CallKey
from tests.support.api import ApiClient
from tests.support.oauth import oauth_world
from workers.pipeline import run_now

DOC = Path(__file__).resolve().parents[2] / "docs" / "connections.md"


def blocks(label: str) -> list[dict]:
    return [json.loads(b) for b in re.findall(rf"^```json {label}\n(.*?)^```", DOC.read_text(), re.S | re.M)]


@pytest.mark.django_db(transaction=True)
def test_the_connections_are_made_as_written_and_the_call_names_one(world):
    client = ApiClient(world.acme_key)
    made = blocks("connection")
    assert [c["kind"] for c in made] == ["oauth2ClientCredentials", "apiKeyHeader", "basic"]
    for body in made:
        answer = client.post("/api/tenants/acme/connections", body)
        assert answer.status_code == 201, answer.json()
        secret = body[connections.SECRET[body["kind"]]]
        assert secret not in json.dumps(answer.json())
        assert answer.headers["Location"].endswith(f"/connections/{body['name']}")
    (call,) = blocks("call")
    answer = client.post("/api/tenants/acme/service-calls", call)
    assert answer.status_code == 202, answer.json()
    assert answer.json()["requestSpec"]["connection"] == "billing"

    # The OAuth2 connection, pointed at a token endpoint and target on 127.0.0.1, runs for real.
    with oauth_world() as auth:
        changed = {"tokenUrl": auth.token_url, "clientId": auth.client_id, "clientSecret": auth.client_secret}
        assert client.patch("/api/tenants/acme/connections/billing", changed).status_code == 200
        local = {**call, "requestSpec": {**call["requestSpec"], "url": auth.url("/invoices")}}
        accepted = client.post("/api/tenants/acme/service-calls", local).json()
        run_now([CallKey("acme", uuid.UUID(accepted["serviceCallId"]))], worker_id="doc")
        assert ServiceCall.objects.get(pk=accepted["serviceCallId"]).status == "Succeeded"
        assert auth.token_requests[0]["form"]["scope"] == [made[0]["scope"]]


@pytest.mark.django_db(transaction=True)
def test_the_commands_run_as_written(world, monkeypatch):
    (script,) = re.findall(r"^```sh\n(.*?)^```", DOC.read_text(), re.S | re.M)
    outputs = []
    for line in script.replace("\\\n", " ").splitlines():
        command = line.split("  #", 1)[0].strip()
        stdin = ""
        if command.startswith("echo "):
            echoed, command = command.split(" | ", 1)
            stdin = shlex.split(echoed)[1]
        args = shlex.split(command)
        assert args[:2] == ["python", "manage.py"], line
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        out = io.StringIO()
        call_command(*args[2:], stdout=out)
        outputs.append(out.getvalue())
    added, listed, rotated, deleted = outputs
    assert json.loads(added)["headerName"] == "X-Api-Key" and "k-7f3a9" not in added
    assert listed.startswith("crm  apiKeyHeader  secret set ")
    assert json.loads(rotated)["secretUpdatedAt"] >= json.loads(added)["secretUpdatedAt"]
    assert deleted == "Deleted connection 'crm'.\n"


def test_the_documented_figures_are_the_codes():
    text = DOC.read_text()
    assert credentials.TOKEN_MARGIN.total_seconds() == 30 and "30 seconds before its" in text
    assert credentials.TOKEN_UNSTATED_LIFE.total_seconds() == 3600 and "for an\n  hour at most" in text
    assert credentials.TOKEN_TIMEOUT_MS == 10_000 and "10 seconds to answer" in text
    assert credentials.TOKEN_ANSWER_BYTES == 64 * 1024 and "64 KiB at most for its answer" in text
    assert f"A tenant has at most {connections.MAX_CONNECTIONS}." in text
    assert connections.CLIENT_AUTH == ("basic", "body")
