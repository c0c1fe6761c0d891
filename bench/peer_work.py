"""A service call's work as a Celery user would write it: the Celery peer's `bench.call` and its
delivery tasks (bench/celery_app.py) run these, one worker process each at a time.

The agent's drain makes, per call, one GET to the bench's target and two events (Running, then
Succeeded or Failed), each delivered to two webhook receivers (signed, Standard Webhooks) and
published to NATS JetStream (acknowledged). The peer does the same network work, as the
common Celery design does it: the call's task makes the request and queues one delivery task
per (event, subscriber), which Celery retries should it fail. What it leaves out is what makes
the agent durable and visible: no database row for the call, its attempt, its events or their
deliveries; a task lost with its worker is gone (bench/README.md, "The same work in Celery").

An event's id is a UUIDv7 made when the event is made: its first 48 bits are that instant in
milliseconds (uuid6 keeps a process's ids in order, so one made in the same millisecond as the
one before is a millisecond later), so a receiver's record of the id gives the delivery lag, to
a millisecond or two, with no other record.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nats  # imported as the worker starts, not on the first publish of the burst
import requests
from standardwebhooks import Webhook
from uuid6 import uuid7

# The peer's webhook secret (bench-only; the receivers do not check signatures, as with the
# agent's deliveries: bench/receiver.py).
SECRET = "whsec_" + base64.b64encode(b"service-agent-bench-peer-secret!").decode()
USER_AGENT = "ServiceAgentBenchPeer/1.0"
TIMEOUT_SECONDS = 15.0  # the agent's webhook timeout


@dataclass(frozen=True)
class Event:
    event_id: str
    body: str  # the envelope as compact JSON: the webhook's body, the NATS message's data


def created_at(event_id: str) -> float:
    """The instant (Unix seconds) the event was made, from its UUIDv7 id."""
    return int(event_id.replace("-", "")[:12], 16) / 1000


class _Process:
    """What a worker process keeps between tasks: an HTTP session (kept-alive connections),
    the signer, and a NATS connection on an asyncio loop of its own. Made on first use in the
    process that uses it (Celery forks its workers)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.session = requests.Session()
        self.session.trust_env = False
        self.signer = Webhook(SECRET)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.js: Any = None
        self.nats_url = ""

    def jetstream(self, url: str) -> Any:
        if self.js is None or self.nats_url != url:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                threading.Thread(target=self.loop.run_forever, name="peer-nats", daemon=True).start()
            connection = self._run(nats.connect(url, connect_timeout=5))
            self.js, self.nats_url = connection.jetstream(timeout=TIMEOUT_SECONDS), url
        return self.js

    def _run(self, coroutine: Any) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(TIMEOUT_SECONDS + 5)


_process: _Process | None = None


def _here() -> _Process:
    global _process
    if _process is None or _process.pid != os.getpid():
        _process = _Process()
    return _process


def _event(type_: str, tenant_id: str, call_id: str, payload: dict[str, Any]) -> Event:
    event_id = str(uuid7())
    envelope = {
        "id": event_id,
        "type": type_,
        "tenantId": tenant_id,
        "aggregateId": call_id,
        "timestampMs": int(time.time() * 1000),
        "correlationId": call_id,
        "causationId": None,
        "payload": {"serviceCallId": call_id, **payload},
    }
    return Event(event_id, json.dumps(envelope, separators=(",", ":")))


def call(url: str, *, tenant_id: str) -> list[Event]:
    """One call: its Running event, the GET, its Succeeded (2xx) or Failed event."""
    call_id = str(uuid7())
    started = datetime.now(UTC)
    events = [_event("ServiceCallRunning", tenant_id, call_id, {"startedAt": started.isoformat(), "attempt": 1})]
    try:
        response = _here().session.get(url, timeout=TIMEOUT_SECONDS)
        status: int | None = response.status_code
    except requests.RequestException:
        status = None
    succeeded = status is not None and 200 <= status < 300
    events.append(
        _event(
            "ServiceCallSucceeded" if succeeded else "ServiceCallFailed",
            tenant_id,
            call_id,
            {"finishedAt": datetime.now(UTC).isoformat(), "attempt": 1, "status": status},
        )
    )
    return events


def deliver_webhook(url: str, event: Event) -> None:
    """POST the event, signed; raises on anything but a 2xx (the task retries)."""
    here = _here()
    now = datetime.now(UTC)
    response = here.session.post(
        url,
        data=event.body.encode(),
        headers={
            "webhook-id": event.event_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": here.signer.sign(event.event_id, now, event.body),
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        },
        timeout=TIMEOUT_SECONDS,
        allow_redirects=False,
    )
    if not 200 <= response.status_code < 300:
        raise requests.HTTPError(f"HTTP {response.status_code}", response=response)


def publish_nats(nats_url: str, subject: str, event: Event) -> None:
    """Publish the event to JetStream and wait for the stream's ack (a duplicate's too)."""
    here = _here()
    js = here.jetstream(nats_url)
    here._run(js.publish(subject, event.body.encode(), headers={"Nats-Msg-Id": event.event_id}))
