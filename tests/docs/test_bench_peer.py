"""The Celery peer's work (bench/peer_work.py, bench/README.md "The same work in Celery"): the
call's request and events, a signed webhook, an acknowledged JetStream publish, and the
figures the bench draws from what the subscribers received. Run here without Celery: the
tasks only call these."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from standardwebhooks import Webhook

from bench import peer_work
from bench.agent import delivery_figures


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, status: int) -> None:
        self.status = status
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.command, dict(self.headers), body))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer


@pytest.fixture
def server(request) -> Iterator[_Server]:
    srv = _Server(getattr(request, "param", 200))
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_call_makes_its_request_and_two_events_whose_ids_tell_when_they_were_made(server):
    before = time.time()
    events = peer_work.call(f"{server.url}/ok", tenant_id="t1")
    after = time.time()

    assert [(method, body) for method, _, body in server.seen] == [("GET", b"")]
    envelopes = [json.loads(event.body) for event in events]
    assert [envelope["type"] for envelope in envelopes] == ["ServiceCallRunning", "ServiceCallSucceeded"]
    assert [envelope["id"] for envelope in envelopes] == [event.event_id for event in events]
    assert envelopes[0]["aggregateId"] == envelopes[1]["aggregateId"]
    assert envelopes[1]["payload"]["status"] == 200
    for event in events:  # to the millisecond, and one more should ids be made in the same one
        assert before - 0.001 <= peer_work.created_at(event.event_id) <= after + 0.003


@pytest.mark.parametrize("server", [500], indirect=True)
def test_a_call_answered_with_an_error_ends_failed(server):
    events = peer_work.call(f"{server.url}/ok", tenant_id="t1")
    finished = json.loads(events[1].body)
    assert (finished["type"], finished["payload"]["status"]) == ("ServiceCallFailed", 500)


def test_a_webhook_is_signed_as_standard_webhooks_sign(server):
    event = peer_work.call(f"{server.url}/ok", tenant_id="t1")[0]
    server.seen.clear()
    peer_work.deliver_webhook(f"{server.url}/hook", event)

    [(method, headers, body)] = server.seen
    assert method == "POST" and body == event.body.encode()
    headers = {name.lower(): value for name, value in headers.items()}
    assert headers["webhook-id"] == event.event_id
    assert Webhook(peer_work.SECRET).verify(body, headers) == json.loads(event.body)
    headers["webhook-signature"] = "v1," + "A" * 44
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(peer_work.SECRET).verify(body, headers)


@pytest.mark.parametrize("server", [503], indirect=True)
def test_a_webhook_refused_raises_so_that_its_task_retries(server):
    event = peer_work.Event("01a21cd6-614e-7279-b851-726db8745680", "{}")
    with pytest.raises(requests.HTTPError, match="HTTP 503"):
        peer_work.deliver_webhook(f"{server.url}/hook", event)


@pytest.mark.nats
def test_a_nats_publish_is_stored_once_under_its_event_id():
    from nats.js.api import StreamConfig

    from tests.support.nats import NATS_TEST_URL, run_js

    suffix = secrets.token_hex(4)
    name, prefix = f"SA_PEER_{suffix.upper()}", f"sapeer{suffix}"

    async def create(js) -> None:
        await js.add_stream(StreamConfig(name=name, subjects=[f"{prefix}.>"], duplicate_window=60))

    async def read(js) -> list[tuple[str, bytes]]:
        info = await js.stream_info(name)
        sub = await js.pull_subscribe(f"{prefix}.>", stream=name)
        messages = await sub.fetch(batch=10, timeout=2) if info.state.messages else []
        return [(msg.headers["Nats-Msg-Id"], msg.data) for msg in messages]

    async def delete(js) -> None:
        await js.delete_stream(name)

    run_js(create)
    try:
        event = peer_work.call("http://127.0.0.1:9/unreachable", tenant_id="t1")[0]
        peer_work.publish_nats(NATS_TEST_URL, f"{prefix}.t1", event)
        peer_work.publish_nats(NATS_TEST_URL, f"{prefix}.t1", event)  # a retry: the same message
        assert run_js(read) == [(event.event_id, event.body.encode())]
    finally:
        run_js(delete)


def test_the_figures_take_each_events_first_arrival_and_count_what_is_missing():
    created = {"a": 10.0, "b": 11.0}
    records = {
        "webhook-1": [("a", 10.5), ("a", 10.2), ("b", 11.1), ("other", 1.0)],
        "webhook-2": [("b", 12.0)],
        "nats": [("a", 10.1), ("b", 11.3)],
    }
    figures = delivery_figures(created, records)

    assert (figures["events"], figures["expected"], figures["missing"]) == (2, 6, 1)
    assert figures["per_subscriber"]["webhook-1"]["received"] == 2
    assert figures["per_subscriber"]["webhook-1"]["tries_received"] == 3
    assert figures["per_subscriber"]["webhook-2"]["missing"] == 1
    assert figures["webhooks"]["deliveries"] == 3
    assert figures["per_subscriber"]["webhook-1"]["lag_ms"]["max"] == pytest.approx(200)  # a's first, 10.2
    assert figures["webhooks"]["lag_ms"]["max"] == pytest.approx(1000)
    assert figures["webhooks"]["first_created_to_last_received_s"] == pytest.approx(2.0)
    assert figures["nats"]["lag_ms"]["min"] == pytest.approx(100)
    assert figures["nats"]["first_created_to_last_received_s"] == pytest.approx(1.3)


def test_the_receiver_counts_and_lists_what_it_received():
    """bench/receiver.py: `/count` while the bench waits, `/records` once it is done."""
    import subprocess
    import sys
    from pathlib import Path

    from bench.agent import Delivery

    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, str(root / "bench" / "receiver.py")], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(child.stdout.readline())}"
        delivery = Delivery.__new__(Delivery)  # only its readers of a receiver
        assert delivery.webhook_count(url) == 0
        for event_id in ("e1", "e2"):
            requests.post(f"{url}/hook", data=b"{}", headers={"webhook-id": event_id}, timeout=5)
        assert delivery.webhook_count(url) == 2
        assert [event_id for event_id, _ in delivery.webhook_records(url)] == ["e1", "e2"]
    finally:
        child.terminate()
        child.wait(5)
