"""docs/retries.md stays true: its policy example is accepted as written, its defaults and
bounds are the validator's, and its headers table names the headers every attempt carries."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from orchestration import retries
from orchestration.models import ServiceCall
from orchestration.services import StartedCall
from tests.support.api import ApiClient, calls_url, valid_payload
from workers.pipeline import order_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "retries.md"


def _json_blocks() -> list[str]:
    return re.findall(r"^```json\n(.*?)^```", DOC.read_text(), re.S | re.M)


@pytest.mark.django_db
def test_the_policy_example_is_accepted_and_shown_back_as_written(world):
    (block,) = _json_blocks()
    policy = json.loads("{" + block + "}")["retryPolicy"]
    response = ApiClient(world.acme_key).post(calls_url(), valid_payload(retryPolicy=policy))
    assert response.status_code == 202, response.json()
    assert response.json()["retryPolicy"] == policy
    assert ServiceCall.objects.get(pk=response.json()["serviceCallId"]).retry_policy == policy


def test_the_documented_defaults_and_bounds_are_the_validators():
    text = DOC.read_text()
    policy, errors = retries.policy_errors({})
    assert errors == {} and policy is not None
    assert f"| `maxAttempts` | {policy.max_attempts} (no retry) | 1–{retries.MAX_ATTEMPTS}," in text
    assert f"| `minBackoffMs` | {policy.min_backoff_ms} | 100 ms – 1 day" in text
    assert f"| `maxBackoffMs` | {policy.max_backoff_ms} (or" in text
    assert retries.BACKOFF_FLOOR_MS == 100 and retries.BACKOFF_CEILING_MS == 86_400_000
    for value in retries.RetryOn.ALL:
        assert f"`{value}`" in text


def test_the_documented_headers_are_the_ones_each_attempt_carries(db):
    call = StartedCall("acme", uuid.UUID(int=7), "c", "GET", "http://x.test/", {}, None, 1000, attempt=3)
    sent = order_for(call).request.agent_headers
    rows = dict(re.findall(r"^\| `(X-Service-Call-[A-Za-z]+)` \| ([^|]+) \|$", DOC.read_text(), re.M))
    assert set(rows) == set(sent) == {"X-Service-Call-Id", "X-Service-Call-Attempt"}
    assert sent == {"X-Service-Call-Id": str(call.service_call_id), "X-Service-Call-Attempt": "3"}
