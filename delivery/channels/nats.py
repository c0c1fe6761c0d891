"""NATS JetStream subscriptions (docs/events.md): each event published to a subject made from
the subscription's template, acknowledged by the stream; a claim's NATS notifications are one
publish batch. Made by an operator only (a template may publish onto any tenant's subjects).

A channel (delivery/channels/base.py): its fields, its tries, what the admin shows. Its
publisher (delivery/nats.py, nats-py) is made on the first try."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings

from core.ids import utcnow
from delivery.channels.base import Channel, ChannelField, ErrorSink
from delivery.envelopes import body_within
from delivery.nats_subjects import subject_for, valid_msg_id, validate_subject_template
from delivery.tries import ClaimedNotification, SendResult, failed_result

if TYPE_CHECKING:
    from delivery.models import Subscription
    from delivery.nats import JetStreamPublisher

SUBJECT_TEMPLATE = ChannelField(
    wire="subjectTemplate",
    column="subject_template",
    only="Only NATS subscriptions have a subject template.",
    admin_field=lambda: forms.CharField(
        required=False,
        help_text="NATS only; blank: the deployment's NATS_SUBJECT_TEMPLATE. Placeholders {tenantId}, {type},"
        " {aggregateId}.",
    ),
)


class NatsChannel(Channel):
    kind = "nats"
    label = "NATS JetStream"
    operator_only = True
    fields = (SUBJECT_TEMPLATE,)
    batched = True
    target_label = "subject"

    def validate(self, data: Mapping[str, Any], *, kind: Any, partial: bool, error: ErrorSink) -> dict[str, Any]:
        template = data.get("subjectTemplate")
        if template is None:  # the default template applies
            return {}
        problem = (
            validate_subject_template(template, stream_subjects=settings.NATS_STREAM_SUBJECTS)
            if isinstance(template, str)
            else "A subject template is a string."
        )
        if problem:
            error("subjectTemplate", problem)
        return {"subject_template": template}

    def target(self, subscription: Subscription) -> str:
        return subscription.subject_template or "(default subject template)"

    def admin_data(self, cleaned: Mapping[str, Any], *, kind: Any, adding: bool) -> dict[str, Any]:
        if cleaned.get("subject_template") or (kind == self.kind and adding):
            return {"subjectTemplate": cleaned.get("subject_template") or None}
        return {}

    def send(self, batch: list[ClaimedNotification]) -> list[SendResult]:
        return send_nats_many(batch)


_publisher_lock = threading.Lock()
_publisher = None


def nats_publisher() -> JetStreamPublisher:
    """The process's one JetStream publisher (its own event loop thread and connection),
    made on first use; its stream (NATS_STREAM, taking NATS_STREAM_SUBJECTS) is ensured then."""
    global _publisher
    with _publisher_lock:
        if _publisher is None:
            from delivery.nats import JetStreamPublisher

            publisher = JetStreamPublisher(
                url=settings.NATS_URL,
                stream=settings.NATS_STREAM,
                subjects=settings.NATS_STREAM_SUBJECTS,
                replicas=settings.NATS_STREAM_REPLICAS,
                timeout_s=settings.NATS_PUBLISH_TIMEOUT_MS / 1000,
            )
            try:
                publisher.ensure_stream()
            except BaseException:
                publisher.close()  # its loop thread and its reconnecting connection too
                raise
            _publisher = publisher
        return _publisher


def send_nats_many(notifications: Sequence[ClaimedNotification]) -> list[SendResult]:
    """Try NATS notifications together: published at once, each acknowledged (or failed) on
    its own; never raises. A batch is one hand-over to the publisher's loop instead of one per
    notification, which made a NATS try cost as much CPU as a webhook's POST."""
    started = utcnow()
    if not settings.NATS_URL:
        return [SendResult(succeeded=False, started_at=started, error="NATS_URL is not set") for _ in notifications]
    results: list[SendResult | None] = [None] * len(notifications)
    try:
        publisher = nats_publisher()
    except Exception as exc:  # the connection, not one message: each of them failed with it
        return [failed_result(started, exc) for _ in notifications]
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
            results[index] = failed_result(started, exc)
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
            failed_result(started, ack, latency_ms=latency_ms)
            if isinstance(ack, Exception)
            else SendResult(succeeded=True, started_at=started, latency_ms=latency_ms)
        )
    return results  # type: ignore[return-value]  # every index is set above


NATS = NatsChannel()
