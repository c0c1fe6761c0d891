"""Real webhook receivers on 127.0.0.1 that verify every signature with `standardwebhooks`.

Paths: /ok, /flaky/<n> (fails n times with 500, then 200), /gone (410), /slow (answers after
2 s), /delay/<ms> (200 after that many milliseconds), /busy (429 with Retry-After: 1),
/redirect (302 to /ok).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.support.loopback import serving


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    verified_with: list[str]


@dataclass
class Receiver:
    host: str
    port: int
    secrets: list[str] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _counts: dict[str, int] = field(default_factory=dict)
    # Requests whose body never arrived whole (the sender was killed while sending).
    cut_off: int = 0

    def url(self, path: str = "/ok") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def envelopes(self, path: str = "/ok") -> list[dict]:
        return [json.loads(r.body) for r in self.at(path)]

    def verify(self, body: bytes, headers: dict[str, str]) -> list[str]:
        """The secrets whose signature is among the request's (standardwebhooks.verify)."""
        good = []
        for secret in self.secrets:
            try:
                Webhook(secret).verify(body, headers)
            except WebhookVerificationError:
                continue
            good.append(secret)
        return good


def _handler(receiver: Receiver):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if len(body) < length:
                # The sender died mid-request (the crash tests kill it): no delivery arrived,
                # and no receiver would take a cut-off body for one.
                with receiver.lock:
                    receiver.cut_off += 1
                return
            headers = {k: v for k, v in self.headers.items()}
            with receiver.lock:
                receiver.received.append(
                    Received(self.path, headers, body, time.time(), receiver.verify(body, headers))
                )
                count = receiver._counts[self.path] = receiver._counts.get(self.path, 0) + 1
            if self.path.startswith("/flaky/"):
                status = 500 if count <= int(self.path.rsplit("/", 1)[1]) else 200
                self._answer(status)
            elif self.path == "/gone":
                self._answer(410)
            elif self.path == "/slow":
                time.sleep(2)
                self._answer(200)
            elif self.path.startswith("/delay/"):
                time.sleep(int(self.path.rsplit("/", 1)[1]) / 1000)
                self._answer(200)
            elif self.path == "/busy":
                self._answer(429, {"Retry-After": "1"})
            elif self.path == "/redirect":
                self._answer(302, {"Location": "/ok"})
            else:
                self._answer(200)

        def _answer(self, status: int, headers: dict[str, str] | None = None) -> None:
            payload = b"{}" if status < 300 else b'{"error":"no"}'
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            try:
                self.wfile.write(payload)
            except OSError:
                pass

    return Handler


@contextmanager
def receiving(*secrets: str) -> Iterator[Receiver]:
    receiver = Receiver("127.0.0.1", 0, secrets=list(secrets))
    with serving(_handler(receiver)) as receiver.port:
        yield receiver
