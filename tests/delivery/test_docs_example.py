"""The receiver example of docs/events.md, run against a real delivery."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from standardwebhooks.webhooks import WebhookVerificationError

from delivery.runner import deliver_now
from delivery.services import subscription_create, subscription_send_test
from delivery.validation import SubscriptionInput
from tests.delivery.receivers import receiving

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def _example() -> dict:
    [code] = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


def test_the_documented_receiver_accepts_a_real_delivery_and_refuses_a_forged_one(transactional_db, world):
    receive = _example()["receive"]
    with receiving() as receiver:
        subscription, secret = subscription_create(
            tenant_id="acme", data=SubscriptionInput(kind="webhook", name="docs", url=receiver.url("/ok"))
        )
        subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
        assert deliver_now() == 1
        [request] = receiver.at("/ok")

    envelope = receive(request.body, request.headers, secret)
    assert envelope["type"] == "ServiceAgentPing" and envelope["id"] == request.headers["webhook-id"]
    with pytest.raises(WebhookVerificationError):
        receive(request.body.replace(b"test event", b"forged one"), request.headers, secret)
