"""Shared fixtures: two tenants with an owner, a member and an outsider; API keys; a real
HTTP target on 127.0.0.1; an in-process engine."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model

from tenants.models import Membership
from tenants.services import api_key_create, membership_add, tenant_create


@dataclass
class World:
    """Tenant `acme` (owner, member) and tenant `globex` (outsider), with one API key each."""

    acme: object
    globex: object
    owner: object
    member: object
    outsider: object
    staff_globex: object
    acme_key: str
    globex_key: str


@pytest.fixture
def world(db) -> World:
    user_model = get_user_model()
    acme = tenant_create(slug="acme", name="Acme")
    globex = tenant_create(slug="globex", name="Globex")
    owner = user_model.objects.create_user("owner", password="pw-owner-123")
    member = user_model.objects.create_user("member", password="pw-member-123")
    outsider = user_model.objects.create_user("outsider", password="pw-outsider-123")
    staff = user_model.objects.create_user("staffglobex", password="pw-staff-123", is_staff=True)
    membership_add(username="owner", tenant_id="acme", role=Membership.Role.OWNER)
    membership_add(username="member", tenant_id="acme")
    membership_add(username="outsider", tenant_id="globex")
    membership_add(username="staffglobex", tenant_id="globex")
    _, acme_key = api_key_create(tenant_id="acme", label="acme test")
    _, globex_key = api_key_create(tenant_id="globex", label="globex test")
    return World(acme, globex, owner, member, outsider, staff, acme_key, globex_key)


@dataclass
class TargetServer:
    """A real HTTP server on 127.0.0.1 recording every request it receives.

    Paths: /ok, /json, /status/<code>, /delay/<ms>, /echo, /gzip-bomb, /drip, /big/<bytes>.
    """

    host: str
    port: int
    requests: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

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
            with server.lock:
                server.requests.append(
                    {
                        "method": self.command,
                        "path": parts.path,
                        "query": parts.query,
                        "headers": dict(self.headers),
                        "body": body.decode("utf-8", "replace"),
                        "at": time.time(),
                    }
                )
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


@pytest.fixture
def http_target() -> Iterator[TargetServer]:
    server = TargetServer(host="127.0.0.1", port=0)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(server))
    httpd.daemon_threads = True
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield server
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def engine(transactional_db):
    """The real engine (timer, execution pool, dispatcher, watchdog) in this process."""
    from workers.engine import Engine
    from workers.keeper import SessionKeeper

    keeper = SessionKeeper()
    running = Engine(keeper)
    running.start()
    yield running
    running.stop(drain_seconds=5)
    keeper.close()


def wait_for(predicate, *, timeout: float = 10.0, interval: float = 0.05):
    """Poll until predicate() is truthy; returns its value or fails the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def pytest_collection_modifyitems(config, items):
    """PostgreSQL-only tests skip on the SQLite pass with a clear reason (scripts/test runs them)."""
    from django.conf import settings

    on_postgres = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    skip_pg = pytest.mark.skip(
        reason="needs PostgreSQL: runs in the PostgreSQL pass of scripts/test (DATABASE_URL=postgres://...)"
    )
    for item in items:
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(skip_pg)
