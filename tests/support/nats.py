"""The tests' own view of a NATS server: whether JetStream answers, and a bounded JetStream
call on a connection of the test's own (never the agent's publisher)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

NATS_TEST_URL = os.environ.get("NATS_TEST_URL", "nats://127.0.0.1:4222")


def jetstream_available(url: str = NATS_TEST_URL) -> bool:
    """Whether a NATS server answers at url and its INFO line says JetStream is on."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222), timeout=1) as sock:
            sock.settimeout(1)
            line = sock.makefile("rb").readline(64 * 1024)
    except OSError:
        return False
    if not line.startswith(b"INFO "):
        return False
    try:
        return bool(json.loads(line[5:]).get("jetstream"))
    except ValueError:
        return False


def run_js(action: Callable[[Any], Any], *, url: str = NATS_TEST_URL, timeout: float = 60) -> Any:
    """Run `action(js)` on a connection of its own, bounded in time. On a thread of its own:
    the browser tests' Playwright leaves an event loop running on the main thread."""
    import nats

    async def main() -> Any:
        nc = await nats.connect(url, allow_reconnect=False, connect_timeout=5)
        try:
            return await asyncio.wait_for(action(nc.jetstream(timeout=5)), timeout)
        finally:
            await nc.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result(timeout + 10)
