"""Webhook subscriptions (docs/events.md): a POST of each event, signed per Standard Webhooks,
through the same egress policy and bounded, pinned rules as service calls, sent on the process's
asyncio loop (execution/aio.py); its signing secret is made at the create and shown once.

A channel (delivery/channels/base.py): its fields, what a new one stores, its tries, what the
admin shows."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.db.models import CheckConstraint, Q

from core.ids import utcnow
from core.secrets import SecretUnavailable, seal_value
from core.signing import live_secrets, new_signing_secret, signature
from delivery.channels.base import Channel, ChannelField, ErrorSink, NewSubscription, Tries
from delivery.envelopes import WEBHOOK_MAX_BODY_BYTES, body_within
from delivery.tries import ClaimedNotification, SendResult, failed_result
from execution.outcomes import ErrorKind, Outcome
from execution.targets import url_error
from execution.wire import USER_AGENT, HttpRequest

if TYPE_CHECKING:
    from delivery.models import Subscription
    from execution.aio import Sender

logger = logging.getLogger("serviceagent.delivery")

# Statuses whose Retry-After is honoured (docs/events.md, "Retries").
_RETRY_AFTER_STATUSES = (429, 503)

URL = ChannelField(
    wire="url",
    column="url",
    only="Only webhook subscriptions have a URL.",
    admin_field=lambda: forms.CharField(label="URL", required=False, help_text="Webhooks only."),
)


class WebhookChannel(Channel):
    kind = "webhook"
    label = "Webhook"
    fields = (URL,)
    signs = True
    target_label = "URL"
    constraints = (CheckConstraint(condition=~Q(kind="webhook") | ~Q(url=""), name="subscriptions_webhook_has_url"),)

    def validate(self, data: Mapping[str, Any], *, kind: Any, partial: bool, error: ErrorSink) -> dict[str, Any]:
        url = data.get("url")
        if kind == self.kind or (partial and "url" in data):
            problem = url_error(url)
            if problem:
                error("url", problem)
        elif url not in (None, ""):
            error("url", URL.only)
        return {} if url is None else {"url": url}

    def create(self, data: Any) -> NewSubscription:
        secret = self.new_secret()
        return NewSubscription(columns={"secret": seal_value(secret)}, shown_once=secret)

    def new_secret(self) -> str:
        return new_webhook_secret()

    def target(self, subscription: Subscription) -> str:
        return subscription.url

    def admin_data(self, cleaned: Mapping[str, Any], *, kind: Any, adding: bool) -> dict[str, Any]:
        if kind == self.kind or cleaned.get("url"):
            return {"url": cleaned.get("url") or ""}
        return {}

    def send(self, batch: list[ClaimedNotification]) -> list[SendResult]:
        """One POST each, waited for together (commands, tests: deliver_now)."""
        started = utcnow()
        requests = [webhook_request(notification, started) for notification in batch]
        out = [request for request in requests if isinstance(request, HttpRequest)]
        outcomes = iter(sender().perform_many(out) if out else [])
        return [
            request if isinstance(request, SendResult) else webhook_result(next(outcomes), started)
            for request in requests
        ]

    def start(self, batches: list[list[ClaimedNotification]], tries: Tries) -> int:
        """Each try handed to the process's asyncio sender, its response coming back by callback
        (no thread waits for it); one that cannot be made or handed over ends at once."""
        webhooks: list[tuple[ClaimedNotification, datetime, HttpRequest]] = []
        ended = 0
        for batch in batches:
            started = utcnow()
            try:
                request = webhook_request(batch[0], started)
            except Exception as exc:  # a bug: a failed try, never a lost one
                logger.exception("starting %d delivery tries failed", len(batch))
                request = failed_result(started, exc)
            if isinstance(request, SendResult):
                tries.try_ended(batch, [request] * len(batch))
                ended += 1
            else:
                webhooks.append((batch[0], started, request))
        if not webhooks:
            return ended
        try:
            sender().submit(
                [
                    (request, functools.partial(_came_back, tries, notification, started))
                    for notification, started, request in webhooks
                ]
            )
        except Exception as exc:
            logger.exception("handing %d webhook tries to the sender failed", len(webhooks))
            for notification, started, _ in webhooks:
                tries.try_ended([notification], [failed_result(started, exc)])
                ended += 1
        return ended


def _came_back(tries: Tries, notification: ClaimedNotification, started: datetime, outcome: Outcome) -> None:
    """A webhook try's response (on the asyncio loop's thread): its result handed back."""
    try:
        result = webhook_result(outcome, started)
    except Exception as exc:
        logger.exception("reading a webhook try's response failed")
        result = failed_result(started, exc)
    tries.try_back([notification], [result])


def sender() -> Sender:
    """The process's asyncio sender (execution/aio.py), imported on the first try: a web
    process, which imports this module with the models, never loads aiohttp."""
    from execution.aio import sender as process_sender

    return process_sender()


def new_webhook_secret() -> str:
    """`whsec_` + base64 of 32 random bytes (Standard Webhooks)."""
    return new_signing_secret()


def webhook_signature(subscription: Subscription, *, msg_id: str, at: datetime, body: str) -> str:
    """`v1,<base64>`, one per live secret, space-separated: during a rotation the previous
    secret signs too, so receivers may switch whenever they like within the overlap."""
    sealed = live_secrets(subscription.secret, subscription.previous_secret, subscription.previous_secret_until, at=at)
    return signature(sealed, msg_id=msg_id, at=at, body=body)


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


WEBHOOK = WebhookChannel()
