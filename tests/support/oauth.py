"""An OAuth2 token endpoint (the client-credentials grant) and a target that accepts only the
tokens it issued, both real HTTP servers on 127.0.0.1, for the connections' tests
(docs/connections.md). Tokens expire after `expires_in` seconds; a token can be revoked (the
target then answers 401); the endpoint can be taken down (503) or made to refuse the client."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote

from tests.support.loopback import serving


@dataclass
class OAuthWorld:
    client_id: str = "agent"
    client_secret: str = "cs-0a7f9c"
    expires_in: int | None = 3600
    down: bool = False
    token_padding: int = 0  # characters added to each token (a JWT with many claims is several KiB)
    granted_scope: str | None = None  # a scope the answer names (another than asked for, say)
    answer: str | None = None  # a raw 200 answer instead of a token (a hostile or broken endpoint)
    delay: float = 0.0  # seconds before the endpoint answers
    token_port: int = 0
    target_port: int = 0
    issued: dict[str, float] = field(default_factory=dict)  # token -> expiry (monotonic)
    revoked: set[str] = field(default_factory=set)
    token_requests: list[dict] = field(default_factory=list)
    received: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def token_url(self) -> str:
        return f"http://127.0.0.1:{self.token_port}/oauth/token"

    def url(self, path: str = "/api") -> str:
        return f"http://127.0.0.1:{self.target_port}{path}"

    def valid(self, token: str) -> bool:
        expiry = self.issued.get(token)
        return expiry is not None and token not in self.revoked and time.monotonic() < expiry


def _client(headers, form: dict[str, list[str]]) -> tuple[str | None, str | None]:
    auth = headers.get("Authorization") or ""
    if auth.startswith("Basic "):
        user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        return unquote(user), unquote(password)
    return (form.get("client_id") or [None])[0], (form.get("client_secret") or [None])[0]


@contextmanager
def oauth_world() -> Iterator[OAuthWorld]:
    world = OAuthWorld()

    class TokenEndpoint(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            form = parse_qs(raw)
            client_id, secret = _client(self.headers, form)
            with world.lock:
                world.token_requests.append(
                    {"form": form, "client_id": client_id, "secret": secret, "basic": "Authorization" in self.headers}
                )
            time.sleep(world.delay)
            if world.down:
                return self._answer(503, {"error": "temporarily_unavailable"})
            if world.answer is not None:
                data = world.answer.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return None
            if form.get("grant_type") != ["client_credentials"]:
                return self._answer(400, {"error": "unsupported_grant_type"})
            if (client_id, secret) != (world.client_id, world.client_secret):
                return self._answer(401, {"error": "invalid_client", "error_description": "Unknown client."})
            with world.lock:
                token = f"tok-{len(world.issued) + 1}-{time.monotonic_ns() % 100000}" + "x" * world.token_padding
                world.issued[token] = time.monotonic() + (world.expires_in or 3600)
            answer = {"access_token": token, "token_type": "Bearer"}
            if world.expires_in is not None:
                answer["expires_in"] = world.expires_in
            if world.granted_scope is not None:
                answer["scope"] = world.granted_scope
            self._answer(200, answer)

    class Target(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            auth = self.headers.get("Authorization") or ""
            token = auth[7:] if auth.startswith("Bearer ") else ""
            ok = world.valid(token)
            with world.lock:
                world.received.append({"method": self.command, "headers": dict(self.headers), "body": body, "ok": ok})
            # The answer echoes the request's Authorization, as careless targets do (a Basic one
            # decoded too).
            echo = {"you sent": auth}
            if auth.startswith("Basic "):
                echo["decoded"] = base64.b64decode(auth[6:]).decode()
            answer = json.dumps(echo).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    with ExitStack() as stack:
        world.token_port = stack.enter_context(serving(TokenEndpoint))
        world.target_port = stack.enter_context(serving(Target))
        yield world
