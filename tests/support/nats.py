"""The tests' own view of a NATS server: whether JetStream answers, a bounded JetStream call on
a connection of the test's own (never the agent's publisher), and the stream that keeps the
server's store directory while tests make and delete theirs."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

NATS_TEST_URL = os.environ.get("NATS_TEST_URL", "nats://127.0.0.1:4222")
KEEP_PREFIX = "SA_TEST_KEEP_"  # the streams of `store_kept`, which stand as long as a session


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
        nc = await nats.connect(servers=url.split(","), allow_reconnect=False, connect_timeout=5)
        try:
            return await asyncio.wait_for(action(nc.jetstream(timeout=5)), timeout)
        finally:
            await nc.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result(timeout + 10)


@contextmanager
def store_kept(url: str = NATS_TEST_URL) -> Iterator[str]:
    """A stream of its own (SA_TEST_KEEP_<hex>, subjects satestkeep<hex>.>, empty) for the
    duration of the block; yields its name.

    nats-server 2.9 removes the account's store directory with its last stream: a stream made
    by another test at that moment fails with "could not create storage directory" (10077).
    While this one stands, the count never falls to none. Tests on xdist workers make and
    delete streams side by side (each its own, on subjects of its own)."""
    suffix = secrets.token_hex(4)
    name = f"{KEEP_PREFIX}{suffix.upper()}"

    async def make(js: Any) -> None:
        await js.add_stream(name=name, subjects=[f"satestkeep{suffix}.>"])

    async def delete(js: Any) -> None:
        import nats.js.errors

        try:
            await js.delete_stream(name)
        except nats.js.errors.NotFoundError:  # removed as stale by another run meanwhile
            pass

    run_js(make, url=url)
    try:
        yield name
    finally:
        run_js(delete, url=url)


async def pulled(js: Any, stream: str, subjects: str, *, quiet: float = 1) -> list:
    """Every message of `stream` on `subjects`, pulled until none comes for `quiet` seconds."""
    import nats.errors

    sub = await js.pull_subscribe(subjects, stream=stream)
    messages = []
    try:
        while True:
            messages += await sub.fetch(batch=100, timeout=quiet)
    # nats-py raises its own TimeoutError, or asyncio's when its deadline ran out between the
    # two requests of a fetch (a loaded machine): either way no more messages came.
    except (nats.errors.TimeoutError, TimeoutError):
        pass
    await sub.unsubscribe()
    return messages
