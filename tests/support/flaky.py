"""A flaky HTTP target on 127.0.0.1 for the retry and cancel tests: it answers each service call
by a script written in the URL, and records every request it receives with the call id and
attempt number the agent sent (X-Service-Call-Id, X-Service-Call-Attempt: docs/retries.md).

The script is the path: `/flaky/<step>/<step>/...`. The n-th request that carries one
X-Service-Call-Id gets the n-th step, the last step repeating. The target counts the requests
itself, so a script never trusts the attempt header it is there to check. A step is

- `<status>`: answer that status at once (`503`, `200`, `404`);
- `<status>-ra<seconds>`: the same with `Retry-After: <seconds>` (`429-ra1`);
- `sleep<ms>`: wait that long, then answer 200 (an attempt with a small timeoutMs times out;
  an attempt in flight when its worker is killed stays unanswered).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from tests.support.loopback import LoopbackServer, serving


@dataclass(frozen=True)
class Arrival:
    """One request as the target received it."""

    call_id: str | None
    attempt: str | None
    path: str
    at: float  # time.time() when its head was read, before any answer


@dataclass
class FlakyTarget:
    host: str
    port: int
    arrivals: list[Arrival] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _seen: Counter = field(default_factory=Counter)

    def url(self, *steps: str | int) -> str:
        return f"http://{self.host}:{self.port}/flaky/{'/'.join(str(step) for step in steps)}"

    def of(self, call_id: object) -> list[Arrival]:
        """The requests received for one call, in arrival order."""
        with self.lock:
            return [a for a in self.arrivals if a.call_id == str(call_id)]

    def pairs(self) -> Counter:
        """How often each (call id, attempt header) pair arrived."""
        with self.lock:
            return Counter((a.call_id, a.attempt) for a in self.arrivals)

    def _step_for(self, call_id: str | None, steps: list[str]) -> str:
        with self.lock:
            self._seen[call_id] += 1
            n = self._seen[call_id]
        return steps[min(n, len(steps)) - 1] if steps else "200"


def _make_handler(target: FlakyTarget) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, status: int, headers: dict[str, str] | None = None) -> None:
            body = json.dumps({"status": status}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            arrived = time.time()
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            path = urlsplit(self.path).path
            call_id = self.headers.get("X-Service-Call-Id")
            with target.lock:
                target.arrivals.append(Arrival(call_id, self.headers.get("X-Service-Call-Attempt"), path, arrived))
            segments = [s for s in path.split("/") if s]
            steps = segments[1:] if segments[:1] == ["flaky"] else []
            step = target._step_for(call_id, steps)
            try:
                if step.startswith("sleep"):
                    time.sleep(int(step.removeprefix("sleep")) / 1000)
                    self._answer(200)
                elif "-ra" in step:
                    status, seconds = step.split("-ra")
                    self._answer(int(status), {"Retry-After": seconds})
                else:
                    self._answer(int(step))
            except OSError:  # the agent gave up (timeout) or its worker was killed
                pass

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    return Handler


class _QuietServer(LoopbackServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A connection the agent dropped (a timeout, a killed worker) is part of these tests."""


@contextmanager
def flaky_target() -> Iterator[FlakyTarget]:
    """A FlakyTarget on a free 127.0.0.1 port for the duration of the block."""
    target = FlakyTarget(host="127.0.0.1", port=0)
    with serving(_make_handler(target), _QuietServer) as target.port:
        yield target


def backoff_bounds_ms(policy: dict, attempt: int) -> tuple[float, float]:
    """The delay after failed attempt `attempt` that the policy allows, in ms: min·2^(n−1) capped
    at maxBackoffMs, ±10 % jitter, within [minBackoffMs, maxBackoffMs] (docs/retries.md, 'When').
    The cap comes before the jitter, so a capped delay is 90-100 % of maxBackoffMs."""
    low, high = policy["minBackoffMs"], policy["maxBackoffMs"]
    base = min(high, low * 2 ** (attempt - 1))
    return max(low, base * 0.9), min(high, base * 1.1)
