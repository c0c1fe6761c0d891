"""docs/events.md's subscription example, as written: the body creates one (201, its secret shown
once), and a receiver on this machine is refused until EGRESS_ALLOWLIST names it."""

from __future__ import annotations

import json
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def _example() -> dict:
    match = re.search(r"<!-- example: subscription -->\n```json\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert match, "no subscription example"
    return json.loads(match.group(1))


def test_the_example_creates_a_subscription_and_a_local_receiver_needs_the_allowlist(world, settings):
    from tests.support.api import ApiClient

    api = ApiClient(world.acme_key)
    body = _example()
    made = api.post("/api/tenants/acme/subscriptions", body)
    assert made.status_code == 201, made.json()
    assert made.json()["secret"].startswith("whsec_") and made.json()["tags"] == ["billing"]

    text = " ".join(DOC.read_text().split())
    assert "`EGRESS_ALLOWLIST=127.0.0.1:9000`" in text
    settings.EGRESS_ALLOWLIST = []  # as shipped (the tests' own settings allow loopback)
    local = {**body, "name": "Local receiver", "url": "http://127.0.0.1:9000/hook"}
    refused = api.post("/api/tenants/acme/subscriptions", local)
    assert refused.status_code == 400 and "url" in refused.json()["errors"]
    settings.EGRESS_ALLOWLIST = ["127.0.0.1:9000"]
    assert api.post("/api/tenants/acme/subscriptions", local).status_code == 201


def test_a_second_agent_needs_only_a_stream_name_and_a_template_of_its_own(tmp_path):
    """The settings of docs/events.md's second agent, as the agent reads them at start: its
    stream's subjects follow its template, apart from the first agent's."""
    import subprocess
    import sys

    from delivery.nats_subjects import stream_subjects_of
    from tests.support.agent_process import ROOT, agent_env

    block = DOC.read_text().split("<!-- example: second agent -->\n", 1)[1].split("\n\n", 1)[0]
    env = agent_env(tmp_path, SECRET_KEY="x" * 50)
    env.pop("NATS_STREAM_SUBJECTS", None)
    env.update(dict(line.strip().split("=", 1) for line in block.splitlines()))
    shown = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
         "print(settings.NATS_STREAM, settings.NATS_STREAM_SUBJECTS)"],
        cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "eventservice.settings"}, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "AGENT_EU ['agent-eu.>']"
    assert stream_subjects_of("serviceagent.{tenantId}.{type}") == ("serviceagent.>",)
    assert stream_subjects_of("{tenantId}.events") == ("serviceagent.>",)  # no fixed part: the default
    assert stream_subjects_of("alerts.all") == ("alerts.>",)
    # A template the old default covers keeps it: an existing deployment's stream is unchanged.
    assert stream_subjects_of("serviceagent.events.{tenantId}.{type}") == ("serviceagent.>",)
