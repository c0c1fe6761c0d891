"""One try of one notification: a webhook POST signed per Standard Webhooks (through the same
egress policy and bounded, pinned rules as service calls, sent on the process's asyncio loop:
execution/aio.py), or a NATS JetStream publish acknowledged by the stream (docs/events.md)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from standardwebhooks.webhooks import Webhook

from core.ids import utcnow
from core.secrets import SecretUnavailable, unseal_value
from delivery.envelopes import WEBHOOK_MAX_BODY_BYTES, body_within
from delivery.models import Subscription
from delivery.services import ClaimedNotification, SendResult
from execution.aio import sender
from execution.outcomes import ErrorKind, Outcome
from execution.wire import USER_AGENT, HttpRequest

# Statuses whose Retry-After is honoured (docs/events.md, "Retries").
_RETRY_AFTER_STATUSES = (429, 503)


def send(notification: ClaimedNotification) -> SendResult:
    """Try it once and wait for the result (commands, tests, one notification); never raises
    (a failure is a result). The delivery loop starts webhook tries without waiting for them
    (delivery/runner.py)."""
    started = utcnow()
    try:
        if notification.subscription.kind == Subscription.Kind.WEBHOOK:
            request = webhook_request(notification, started)
            if isinstance(request, SendResult):
                return request
            return webhook_result(sender().perform_many([request])[0], started)
        return _send_nats(notification, started)
    except Exception as exc:  # a bug or an unreachable dependency is a failed try, not a dead loop
        return SendResult(succeeded=False, started_at=started, error=f"{type(exc).__name__}: {exc}"[:1000])


def webhook_signature(subscription: Subscription, *, msg_id: str, at: datetime, body: str) -> str:
    """`v1,<base64>`, one per live secret, space-separated: during a rotation the previous
    secret signs too, so receivers may switch whenever they like within the overlap."""
    sealed = [subscription.secret]
    if subscription.previous_secret and subscription.previous_secret_until and subscription.previous_secret_until > at:
        sealed.append(subscription.previous_secret)
    keys = (tuple(settings.FIELD_ENCRYPTION_KEYS), settings.SECRET_KEY)
    return " ".join(
        _signer(tuple(secret.items()), keys).sign(msg_id=msg_id, timestamp=at, data=body) for secret in sealed
    )


@functools.lru_cache(maxsize=1024)
def _signer(sealed: tuple[tuple[str, str], ...], keys: tuple[tuple[str, ...], str]) -> Webhook:
    """The signer of a sealed secret under the sealing `keys` (core/secrets.py), unsealed once
    per process rather than once per delivery: Fernet's decryption was a tenth of a webhook
    try. A sealed value unseals to the same secret under the same keys, and a rotated secret is
    another sealed value; a failure to unseal is not cached."""
    return Webhook(unseal_value(dict(sealed)))


def webhook_request(notification: ClaimedNotification, started: datetime) -> HttpRequest | SendResult:
    """The signed POST of one webhook try, or its failed result when no secret can sign it
    (a sealing key gone)."""
    subscription = notification.subscription
    # Cut to fit before signing: the signature covers exactly the bytes sent.
    body = body_within(notification.envelope, notification.body, limit=WEBHOOK_MAX_BODY_BYTES)
    msg_id = str(notification.envelope["id"])
    try:
        signature = webhook_signature(subscription, msg_id=msg_id, at=started, body=body)
    except SecretUnavailable as exc:
        return SendResult(succeeded=False, started_at=started, error=str(exc))
    return HttpRequest(
        method="POST",
        url=subscription.url,
        headers={
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(started.timestamp())),
            "webhook-signature": signature,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        },
        body=body,
        timeout_ms=settings.WEBHOOK_TIMEOUT_MS,
    )


def webhook_result(outcome: Outcome, started: datetime) -> SendResult:
    """A webhook try's result from its response: 2xx succeeded; anything else failed, with a
    429's or 503's Retry-After, and 410 Gone or a refusal by the egress policy marked (either
    disables the subscription)."""
    if outcome.succeeded:
        return SendResult(
            succeeded=True,
            started_at=started,
            latency_ms=outcome.latency_ms,
            status_code=outcome.status,
            response_snippet=outcome.body_snippet or "",
        )
    return SendResult(
        succeeded=False,
        started_at=started,
        latency_ms=outcome.latency_ms,
        status_code=outcome.status,
        response_snippet=outcome.body_snippet or "",
        error=outcome.error_message or f"HTTP {outcome.status}",
        retry_after=_retry_after(outcome.status, outcome.headers),
        gone=outcome.status == 410,
        # Refused by the egress policy: never tried again, as a call's EgressDenied.
        refused=outcome.error_kind == ErrorKind.EGRESS_DENIED,
    )


def _retry_after(status: int | None, headers: dict[str, str]) -> float | None:
    if status not in _RETRY_AFTER_STATUSES:
        return None
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    try:
        return max(0.0, float(value.strip()))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, (parsedate_to_datetime(value) - utcnow()).total_seconds())
        except (TypeError, ValueError):
            return None


# --- NATS JetStream -----------------------------------------------------------------------

_publisher_lock = threading.Lock()
_publisher = None


def nats_publisher():
    """The process's one JetStream publisher (its own event loop thread and connection),
    made on first use; its stream is ensured then."""
    global _publisher
    with _publisher_lock:
        if _publisher is None:
            from delivery.nats import JetStreamPublisher

            publisher = JetStreamPublisher(
                url=settings.NATS_URL, stream=settings.NATS_STREAM, timeout_s=settings.NATS_PUBLISH_TIMEOUT_MS / 1000
            )
            try:
                publisher.ensure_stream()
            except BaseException:
                publisher.close()  # its loop thread and its reconnecting connection too
                raise
            _publisher = publisher
        return _publisher


def _send_nats(notification: ClaimedNotification, started: datetime) -> SendResult:
    return send_nats_many([notification])[0]


def send_nats_many(notifications: Sequence[ClaimedNotification]) -> list[SendResult]:
    """Try NATS notifications together: published at once, each acknowledged (or failed) on
    its own; never raises. A batch is one hand-over to the publisher's loop instead of one per
    notification, which made a NATS try cost as much CPU as a webhook's POST."""
    from delivery.nats import subject_for, valid_msg_id

    started = utcnow()
    if not settings.NATS_URL:
        return [SendResult(succeeded=False, started_at=started, error="NATS_URL is not set") for _ in notifications]
    results: list[SendResult | None] = [None] * len(notifications)
    try:
        publisher = nats_publisher()
    except Exception as exc:  # the connection, not one message: each of them failed with it
        return [_failed(started, exc) for _ in notifications]
    messages, sent = [], []
    for index, notification in enumerate(notifications):
        # Each message made on its own: one that cannot be (a template, an envelope without an
        # id) fails alone, never its batch.
        try:
            template = notification.subscription.subject_template or settings.NATS_SUBJECT_TEMPLATE
            msg_id = str(notification.envelope["id"])
            if not valid_msg_id(msg_id):
                raise ValueError(f"invalid event id {msg_id!r} for a Nats-Msg-Id")
            # An envelope over the server's max_payload is cut to fit (delivery/envelopes.py):
            # sent whole, it would fail every try and hold back the call's later events.
            body = body_within(notification.envelope, notification.body, limit=publisher.payload_limit(msg_id))
            message = (subject_for(template, notification.envelope), body.encode(), msg_id)
        except Exception as exc:
            results[index] = _failed(started, exc)
            continue
        messages.append(message)
        sent.append(index)
    began = time.monotonic()
    try:
        acks: list[Any] = publisher.publish_many(messages) if messages else []
    except Exception as exc:  # the connection, not one message: each of them failed with it
        acks = [exc] * len(messages)
    latency_ms = int((time.monotonic() - began) * 1000)
    for index, ack in zip(sent, acks, strict=True):
        results[index] = (
            _failed(started, ack, latency_ms=latency_ms)
            if isinstance(ack, Exception)
            else SendResult(succeeded=True, started_at=started, latency_ms=latency_ms)
        )
    return results  # type: ignore[return-value]  # every index is set above


def _failed(started: datetime, exc: BaseException, *, latency_ms: int | None = None) -> SendResult:
    return SendResult(
        succeeded=False, started_at=started, latency_ms=latency_ms, error=f"{type(exc).__name__}: {exc}"[:1000]
    )
