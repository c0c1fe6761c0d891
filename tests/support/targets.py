"""The HTTP target of the `http_target` fixture: a real server on 127.0.0.1 that records
every request it receives and answers by path (ok, JSON, a status, a delay, an echo, a gzip
bomb, a drip, a big body)."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from tests.support.loopback import serving


@dataclass
class TargetServer:
    """A real HTTP server on 127.0.0.1 recording every request it receives.

    Paths: /ok, /json, /status/<code>, /delay/<ms>, /echo, /gzip-bomb, /drip, /big/<bytes>.
    """

    host: str
    port: int
    requests: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Requests being answered now; each record's "concurrent" is this count as it arrived
    # (itself included), and its "done" the time its answer was sent.
    active: int = 0

    def url(self, path: str = "/ok") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def count(self, path_prefix: str = "") -> int:
        with self.lock:
            return sum(1 for r in self.requests if r["path"].startswith(path_prefix))


def _make_handler(server: TargetServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str = "application/json", extra=None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            record = {
                "method": self.command,
                "path": parts.path,
                "query": parts.query,
                "headers": dict(self.headers),
                "body": body.decode("utf-8", "replace"),
                "at": time.time(),
            }
            with server.lock:
                server.active += 1
                record["concurrent"] = server.active
                server.requests.append(record)
            try:
                self._answer(parts, body)
            finally:
                with server.lock:
                    server.active -= 1
                    record["done"] = time.time()

        def _answer(self, parts, body: bytes) -> None:
            segments = [s for s in parts.path.split("/") if s]
            head = segments[0] if segments else "ok"
            if head == "status":
                code = int(segments[1])
                self._send(code, json.dumps({"status": code}).encode())
            elif head == "delay":
                time.sleep(int(segments[1]) / 1000)
                self._send(200, b'{"delayed":true}')
            elif head == "echo":
                payload = {
                    "method": self.command,
                    "path": parts.path,
                    "query": parse_qs(parts.query),
                    "headers": dict(self.headers),
                    "body": body.decode("utf-8", "replace"),
                }
                self._send(200, json.dumps(payload).encode())
            elif head == "gzip-bomb":
                bomb = gzip.compress(b"\0" * (50 * 1024 * 1024))
                self._send(200, bomb, "application/octet-stream", {"Content-Encoding": "gzip"})
            elif head == "big":
                self._send(200, b"x" * int(segments[1]), "text/plain")
            elif head == "drip":
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", "100000")
                self.end_headers()
                try:
                    for _ in range(100000):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.2)
                except OSError:
                    pass
            elif head == "json":
                self._send(200, json.dumps({"hello": "world", "items": [1, 2, 3]}).encode())
            else:
                self._send(200, b'{"ok":true}')

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    return Handler


@contextmanager
def serving_target() -> Iterator[TargetServer]:
    """A TargetServer on a free 127.0.0.1 port for the duration of the block."""
    server = TargetServer(host="127.0.0.1", port=0)
    with serving(_make_handler(server)) as server.port:
        yield server
