"""NATS JetStream for event delivery (docs/events.md): a publisher that blocking worker threads
share. The subject rules it sends on are delivery/nats_subjects.py (re-exported here).

Transport: one asyncio loop in a daemon thread of its own, one nats-py connection that
reconnects by itself, and `publish()` that blocks the calling thread until the stream's ack.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import CancelledError as FutureCancelledError
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import Header, PubAck, StreamConfig

from delivery.nats_subjects import (
    DEFAULT_STREAM_SUBJECTS,
    DEFAULT_SUBJECT_TEMPLATE,
    PLACEHOLDERS,
    SUBJECT_TEMPLATE_MAX_LENGTH,
    nats_servers,
    subject_covers,
    subject_for,
    valid_msg_id,
    validate_stream_subjects,
    validate_subject_template,
    without_credentials,
)

__all__ = [
    "DEFAULT_STREAM",
    "DEFAULT_STREAM_SUBJECTS",
    "DEFAULT_SUBJECT_TEMPLATE",
    "MIN_DUPLICATE_WINDOW_S",
    "PLACEHOLDERS",
    "SUBJECT_TEMPLATE_MAX_LENGTH",
    "JetStreamError",
    "JetStreamPublisher",
    "PublishAck",
    "subject_covers",
    "subject_for",
    "valid_msg_id",
    "validate_stream_subjects",
    "validate_subject_template",
]

logger = logging.getLogger(__name__)

DEFAULT_STREAM = "SERVICEAGENT"
# The spec asks for at least ten minutes: a notification retried within that window after a
# lost ack is stored once.
MIN_DUPLICATE_WINDOW_S = 600
_STREAM_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")


class JetStreamError(Exception):
    """Publishing or stream set-up failed: timeout, no stream for the subject, refused, closed."""


@dataclass(frozen=True)
class PublishAck:
    stream: str
    seq: int
    duplicate: bool  # the stream already held this Nats-Msg-Id: stored once, still a success


T = TypeVar("T")


# The most a message's header can take beside its Nats-Msg-Id value:
# "NATS/1.0\r\n" "Nats-Msg-Id: " <id> "\r\n" "\r\n", with room to spare.
_HEADER_BYTES = 64


def _over_max_payload(nc: NATS, payload: bytes, msg_id: str) -> bool:
    """Whether the message is over the server's max_payload. nats-py checks the payload alone;
    the server counts the header too, and closes the connection (every message out on it) for a
    message over its limit."""
    return len(payload) + _HEADER_BYTES + len(msg_id) > nc.max_payload


class _AckInbox:
    """The acks of one connection's published messages, on one subscription of an inbox of its
    own: each message's reply subject is the inbox and a token of its own, and its ack, or the
    server's refusal, settles the future `publish` made for the token. All on the publisher's
    loop.

    nats-py 2.16's `JetStreamContext.publish_async` works the same way, but a publish that
    raises (a message over the server's max_payload, a full reconnect buffer) leaves its future
    and a permit of its pending limit behind for good, and a stream's refusal never settles its
    future (its reply handler raises instead: nats-io/nats.py#985), so the message waited out
    the whole timeout. Here a token is forgotten when its batch ends, whatever happened."""

    def __init__(self, nc: NATS, where: str) -> None:
        self._nc = nc
        self._where = where
        self._prefix = nc.new_inbox()
        self._tokens = itertools.count()
        self._waiting: dict[str, asyncio.Future[PubAck]] = {}

    async def subscribe(self) -> None:
        # nats-py subscribes again after a reconnect; the inbox stays the same.
        await self._nc.subscribe(f"{self._prefix}.*", cb=self._settle)

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> tuple[str, asyncio.Future[PubAck]]:
        """Send one message on this inbox's connection; (token, future of its ack). A message
        that cannot be sent has its error in the future at once, and the others go on."""
        token = str(next(self._tokens))
        ack = self._waiting[token] = asyncio.get_running_loop().create_future()
        if _over_max_payload(self._nc, payload, msg_id):
            ack.set_exception(nats.errors.MaxPayloadError())
            return token, ack
        try:
            await self._nc.publish(subject, payload, reply=f"{self._prefix}.{token}", headers={Header.MSG_ID: msg_id})
        except nats.errors.Error as error:  # no connection to send on, a full reconnect buffer
            ack.set_exception(error)
        except Exception as exc:  # a bug, or the socket's own error: this message's failure
            ack.set_exception(JetStreamError(f"NATS at {self._where}: could not send: {exc}"))
        return token, ack

    def forget(self, tokens: Sequence[str]) -> None:
        for token in tokens:
            self._waiting.pop(token, None)

    async def _settle(self, msg: Any) -> None:
        ack = self._waiting.get(msg.subject[len(self._prefix) + 1 :])
        if ack is None or ack.done():  # late: its batch has ended
            return
        if msg.headers and msg.headers.get(Header.STATUS) == "503":
            ack.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            answer = json.loads(msg.data)
            error = answer.get("error")
            if error is not None:
                ack.set_exception(
                    nats.js.errors.APIError(
                        code=error.get("code"), err_code=error.get("err_code"), description=error.get("description")
                    )
                )
            else:
                ack.set_result(PubAck.from_response(answer))
        except Exception as exc:  # not a JetStream answer: this message failed, not the batch
            ack.set_exception(JetStreamError(f"NATS at {self._where} answered with no ack: {exc}"))


class JetStreamPublisher:
    """Publishes to JetStream from any number of plain threads.

    One asyncio loop runs in a daemon thread of its own, started with the connection on first
    use. nats-py reconnects by itself (forever: the agent is long-lived), and while NATS is
    unreachable each call fails after `timeout_s` with JetStreamError instead of hanging.
    """

    def __init__(
        self,
        *,
        url: str,
        stream: str = DEFAULT_STREAM,
        subjects: Sequence[str] = DEFAULT_STREAM_SUBJECTS,
        duplicate_window_s: float = MIN_DUPLICATE_WINDOW_S,
        replicas: int = 1,
        timeout_s: float = 5.0,
    ) -> None:
        if not _STREAM_NAME.fullmatch(stream):
            raise ValueError(f"invalid stream name {stream!r}: use letters, digits, '-' and '_'")
        if duplicate_window_s < MIN_DUPLICATE_WINDOW_S:
            raise ValueError(f"the duplicate window must be at least {MIN_DUPLICATE_WINDOW_S}s")
        self._servers = nats_servers(url)
        if not self._servers:
            raise ValueError("a NATS url is required")
        # For log lines and errors: the servers without any user:password@.
        self.where = ", ".join(map(without_credentials, self._servers))
        self.stream = stream
        self.subjects = list(subjects)
        self._duplicate_window_s = duplicate_window_s
        self.replicas = replicas
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Written only on the loop's thread:
        self._nc: NATS | None = None
        self._acks: _AckInbox | None = None  # the connection's, made with it
        self._connecting: asyncio.Task[JetStreamContext] | None = None
        self._last_error: str | None = None

    # Called from any thread.

    def ensure_stream(self) -> Literal["created", "exists", "updated"]:
        """Create the stream when missing ("created"); leave an existing one alone ("exists")
        unless its subjects miss ours, then add ours and change nothing else ("updated")."""
        return self._call(self._ensure_stream())

    def publish(self, *, subject: str, payload: bytes, msg_id: str) -> PublishAck:
        """Block until the stream acks the message; the stream stores a msg_id once per
        duplicate window. Raises JetStreamError on timeout, no stream for the subject, or a
        refusal."""
        if not valid_msg_id(msg_id):
            raise ValueError(f"invalid msg_id {msg_id!r}")
        return self._call(self._publish(subject, payload, msg_id))

    def publish_many(self, messages: Sequence[tuple[str, bytes, str]]) -> list[PublishAck | JetStreamError]:
        """Publish (subject, payload, msg_id) messages at once and wait for every ack: one
        hand-over to the loop for the batch, not one per message, and the messages' round trips
        overlap. Each message gets its ack or its own JetStreamError (one too large, one the
        stream refuses, one whose ack is lost, each of them when the connection goes); the whole
        batch fails (raises) only when no connection is made within the timeout."""
        for _, _, msg_id in messages:
            if not valid_msg_id(msg_id):
                raise ValueError(f"invalid msg_id {msg_id!r}")
        # The acks have their own timeout each: the batch's bound leaves them room to fail one by one.
        return self._call(self._publish_many(messages), timeout_s=2 * self._timeout_s) if messages else []

    def payload_limit(self, msg_id: str) -> int:
        """The most payload bytes a message with this Nats-Msg-Id may carry: the server's
        max_payload (as it announced it on connecting; nats-py's 1 MiB default before) less
        its header (see `_over_max_payload`)."""
        nc = self._nc
        max_payload = nc.max_payload if nc is not None and nc.max_payload else 1024 * 1024
        return max_payload - _HEADER_BYTES - len(msg_id)

    def close(self) -> None:
        """Drain the connection and stop the loop thread; later calls raise JetStreamError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(self._timeout_s + 1)
        except Exception as error:  # closing goes on whatever the connection's state
            logger.warning("closing the NATS connection to %s: %s", self.where, error)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(self._timeout_s)

    def _call(self, coroutine: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        timeout_s = timeout_s or self._timeout_s
        with self._lock:
            if self._closed:
                coroutine.close()
                raise JetStreamError("the JetStream publisher is closed")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._run_loop, args=(self._loop,), name="nats-publisher", daemon=True
                )
                self._thread.start()
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, timeout_s), loop)
        try:
            # The loop enforces timeout_s; the extra second only guards against a stuck loop.
            return future.result(timeout_s + 1)
        except TimeoutError:
            future.cancel()
            why = f" (last error: {self._last_error})" if self._last_error else ""
            raise JetStreamError(f"no answer from NATS at {self.where} within {timeout_s}s{why}") from None
        except FutureCancelledError:
            raise JetStreamError("the JetStream publisher was closed") from None
        except nats.errors.Error as error:
            raise JetStreamError(f"NATS at {self.where}: {error}") from error

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    # Run on the loop's thread.

    async def _jetstream(self) -> JetStreamContext:
        """The connected context, shared by every call; one connection attempt at a time."""
        task = self._connecting
        broken = task is not None and task.done() and (task.cancelled() or task.exception() is not None)
        if task is None or broken or (self._nc is not None and self._nc.is_closed):
            task = self._connecting = asyncio.ensure_future(self._connect())
        # Shielded: a caller that times out gives up waiting, not the connection attempt.
        return await asyncio.shield(task)

    async def _connect(self) -> JetStreamContext:
        nc = self._nc = NATS()
        try:
            await nc.connect(
                servers=self._servers,
                name="service-agent",
                max_reconnect_attempts=-1,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
            acks = _AckInbox(nc, self.where)
            await acks.subscribe()
        except Exception:
            await nc.close()
            raise
        self._acks = acks
        self._last_error = None
        logger.info("connected to NATS at %s", self._connected_to())
        return nc.jetstream(timeout=self._timeout_s)

    def _connected_to(self) -> str:
        """The server of the connection now, without credentials (several may be named)."""
        url = self._nc.connected_url if self._nc is not None else None
        return without_credentials(url.geturl()) if url is not None else self.where

    async def _on_error(self, error: Exception) -> None:
        # nats-py reports every failed attempt (one each 2 s while NATS is down): log changes only.
        text = str(error) or type(error).__name__
        if text != self._last_error:
            self._last_error = text
            logger.warning("NATS at %s: %s", self.where, text)

    async def _on_disconnected(self) -> None:
        if not self._closed:  # close() disconnects too
            logger.warning("disconnected from NATS at %s; reconnecting", self.where)

    async def _on_reconnected(self) -> None:
        self._last_error = None
        logger.info("reconnected to NATS at %s", self._connected_to())

    async def _publish(self, subject: str, payload: bytes, msg_id: str) -> PublishAck:
        js = await self._jetstream()
        assert self._nc is not None  # the connection _jetstream made
        if _over_max_payload(self._nc, payload, msg_id):
            raise self._as_error(nats.errors.MaxPayloadError())
        return await self._publish_on(js, subject, payload, msg_id)

    async def _publish_many(self, messages: Sequence[tuple[str, bytes, str]]) -> list[PublishAck | JetStreamError]:
        await self._jetstream()
        inbox = self._acks  # the connection's own: sent on it, answered to it
        assert inbox is not None  # made with the connection _jetstream made
        # Each message's ack comes to the connection's ack inbox (_AckInbox): no request, task
        # or timer per message, as js.publish makes. Each is waited for within the timeout, so a
        # lost ack fails its message and not the others; _call bounds the whole batch.
        tokens, acks = [], []
        try:
            for subject, payload, msg_id in messages:
                token, ack = await inbox.publish(subject, payload, msg_id)
                tokens.append(token)
                acks.append(ack)
            waiting = [ack for ack in acks if not ack.done()]
            if waiting:
                await asyncio.wait(waiting, timeout=self._timeout_s)
        finally:
            inbox.forget(tokens)
            for ack in acks:
                ack.cancel()  # unanswered: no longer waited for (an answered one stays as it is)
        return [self._answer(ack, subject) for ack, (subject, _, _) in zip(acks, messages, strict=True)]

    def _answer(self, ack: asyncio.Future[Any], subject: str) -> PublishAck | JetStreamError:
        if ack.cancelled():
            return JetStreamError(f"no ack from NATS at {self.where} within {self._timeout_s}s")
        error = ack.exception()
        if error is None:
            result = ack.result()
            return PublishAck(stream=result.stream, seq=result.seq, duplicate=bool(result.duplicate))
        return self._refusal(error, subject) or self._as_error(error)

    def _as_error(self, error: BaseException) -> JetStreamError:
        if isinstance(error, JetStreamError):
            return error
        if isinstance(error, TimeoutError):  # nats-py's TimeoutError is one too
            return JetStreamError(f"no ack from NATS at {self.where} within {self._timeout_s}s")
        if isinstance(error, nats.errors.Error):
            return JetStreamError(f"NATS at {self.where}: {error}")
        raise error

    async def _publish_on(self, js: JetStreamContext, subject: str, payload: bytes, msg_id: str) -> PublishAck:
        try:
            ack = await js.publish(subject, payload, headers={Header.MSG_ID: msg_id})
        except (nats.js.errors.NoStreamResponseError, nats.js.errors.APIError) as error:
            raise self._refusal(error, subject) from None  # never None for these two
        return PublishAck(stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))

    def _refusal(self, error: BaseException, subject: str) -> JetStreamError | None:
        """The JetStreamError for a stream's refusal of a message (none takes its subject, or
        the stream said no); None for any other error."""
        if isinstance(error, nats.js.errors.NoStreamResponseError):
            return JetStreamError(f"no stream takes subject {subject!r} on NATS at {self.where} (no responders)")
        if isinstance(error, nats.js.errors.APIError):
            return JetStreamError(
                f"the stream refused the message on {subject!r}: {error.description} "
                f"(code {error.code}, err_code {error.err_code})"
            )
        return None

    async def _ensure_stream(self) -> Literal["created", "exists", "updated"]:
        await self._jetstream()
        info = await self._api(f"STREAM.INFO.{self.stream}")
        if info.get("error", {}).get("code") == 404:
            config = StreamConfig(
                name=self.stream,
                subjects=self.subjects,
                duplicate_window=self._duplicate_window_s,
                num_replicas=self.replicas,
            ).as_dict()
            # Two agents starting together both create: the server accepts an identical config.
            self._check(await self._api(f"STREAM.CREATE.{self.stream}", config), "create")
            logger.info("created JetStream stream %s for %s", self.stream, ", ".join(self.subjects))
            return "created"
        self._check(info, "read")
        # The server's own config, unparsed: an update sends back every field as it was, even
        # those this nats-py version does not know (its StreamConfig would drop them).
        config = info["config"]
        window_s = (config.get("duplicate_window") or 0) / 1e9
        if window_s < self._duplicate_window_s:
            logger.warning(
                "JetStream stream %s keeps a duplicate window of %ss, less than %ss: a retry after "
                "that long may store an event twice",
                self.stream,
                window_s,
                self._duplicate_window_s,
            )
        if (config.get("num_replicas") or 1) != self.replicas:
            logger.warning(
                "JetStream stream %s keeps %s replicas, not NATS_STREAM_REPLICAS=%s: left as it is "
                "(a stream's replicas are changed on the NATS side: nats stream edit --replicas)",
                self.stream,
                config.get("num_replicas") or 1,
                self.replicas,
            )
        have = config.get("subjects") or []
        missing = [s for s in self.subjects if not any(subject_covers(pattern, s) for pattern in have)]
        if not missing:
            return "exists"
        # Only ever add subjects: removing some, or re-creating the stream, would lose messages
        # or break other publishers. The server refuses subjects another stream already takes.
        config["subjects"] = [*have, *missing]
        self._check(await self._api(f"STREAM.UPDATE.{self.stream}", config), "add subjects to")
        logger.warning("added %s to JetStream stream %s (had %s)", ", ".join(missing), self.stream, have)
        return "updated"

    async def _api(self, operation: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self._nc is not None
        data = json.dumps(body).encode() if body is not None else b""
        try:
            reply = await self._nc.request(f"$JS.API.{operation}", data, timeout=self._timeout_s)
        except nats.errors.NoRespondersError:
            raise JetStreamError(f"JetStream is not enabled on NATS at {self.where} (no responders)") from None
        return json.loads(reply.data)

    def _check(self, answer: dict[str, Any], doing: str) -> None:
        error = answer.get("error")
        if error:
            raise JetStreamError(
                f"could not {doing} JetStream stream {self.stream}: {error.get('description')} "
                f"(code {error.get('code')}, err_code {error.get('err_code')})"
            )

    async def _shutdown(self) -> None:
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        nc = self._nc
        if nc is None or nc.is_closed:
            return
        try:
            await asyncio.wait_for(nc.drain(), self._timeout_s)
        except Exception:  # drain refuses while (re)connecting; close regardless
            await nc.close()
