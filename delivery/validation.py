"""Validation of subscription input, shared by the API, the dashboard, the admin and the
commands: every mistake reported at once, nothing stored (docs/events.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.errors import ValidationFailed
from core.text import MAX_TAGS, name_problem, tag_problem
from delivery.channels import DEFAULT_KIND, channels
from outbox.models import OutboxEvent

MAX_NAME = 200
# The event types a subscription may name: every call event (and the test ping, which is
# always sent to the one subscription it tests).
EVENT_TYPES = tuple(OutboxEvent.Type.values)
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
# Lone UTF-16 surrogates (JSON may spell them) cannot be stored or shown as UTF-8.
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class SubscriptionInput:
    """What a create or an update gives; None leaves a field as it is (updates). `url` and
    `subject_template` are the columns the channels' own fields are stored in (delivery/channels/)."""

    kind: str | None = None
    name: str | None = None
    url: str | None = None
    subject_template: str | None = None
    event_types: tuple[str, ...] | None = None
    tags: tuple[str, ...] | None = None
    enabled: bool | None = None


def validate_subscription(data: Any, *, partial: bool = False, operator: bool = False) -> SubscriptionInput:
    """A create (`partial=False`) or an update. Tenants make the kinds that are not
    `operator_only` (webhooks); an operator (the admin, operator-wide subscriptions) may make
    every kind (NATS too). Each channel checks its own fields (delivery/channels/)."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["Expected a JSON object."]})
    offered = [channel for channel in channels() if operator or not channel.operator_only]
    allowed = {"kind", "name", "eventTypes", "tags", "enabled"} | {
        field.wire for channel in offered for field in channel.fields
    }
    errors: dict[str, list[str]] = {}

    def error(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    for unknown in sorted(set(data) - allowed):
        error(unknown if isinstance(unknown, str) and not _CONTROL.search(unknown) else "body", "Unknown field.")

    # A field given is checked, null too (the schema's types are not nullable): null is not "absent".
    kind = data.get("kind")
    kinds = tuple(channel.kind for channel in offered)
    if "kind" not in data and not partial:
        kind = DEFAULT_KIND
    if "kind" in data and (partial or kind not in kinds):
        if partial:
            error("kind", "The kind of a subscription cannot be changed.")
        else:
            error("kind", f"kind must be one of: {', '.join(kinds)}.")

    name = data.get("name")
    if "name" in data or not partial:
        if not isinstance(name, str) or not name.strip():
            error("name", "A name is required.")
        elif len(name.strip()) > MAX_NAME:
            error("name", f"The name is longer than {MAX_NAME} characters.")
        elif _SURROGATE.search(name):
            error("name", "The name must not contain lone UTF-16 surrogates: it is not valid Unicode text.")
        elif (problem := name_problem(name)) is not None:
            # The rule of call names (core.text): no control or invisible formatting character.
            error("name", problem)
        else:
            name = name.strip()

    # Every channel looks at its own fields, whatever the kind (a URL on a NATS subscription is
    # a mistake the webhook channel reports); the values given, by column.
    columns: dict[str, Any] = {}
    for channel in channels():
        columns.update(channel.validate(data, kind=kind, partial=partial, error=error))

    event_types = data.get("eventTypes")
    if "eventTypes" in data:
        if not isinstance(event_types, list) or not all(isinstance(t, str) for t in event_types):
            error("eventTypes", "eventTypes is a list of event type names.")
            event_types = None
        else:
            unknown_types = [t for t in event_types if t not in EVENT_TYPES]
            if unknown_types:
                shown = ", ".join(repr(t[:40]) for t in unknown_types[:3])
                error("eventTypes", f"Unknown event type {shown}; known: {', '.join(EVENT_TYPES)}.")
            event_types = tuple(dict.fromkeys(event_types))

    tags = data.get("tags")
    if "tags" in data:
        if not isinstance(tags, list):
            error("tags", "tags is a list of call tags.")
            tags = None
        else:
            for problem in dict.fromkeys(p for p in map(tag_problem, tags) if p is not None):
                error("tags", problem)
            tags = tuple(dict.fromkeys(t for t in tags if isinstance(t, str)))
            if len(tags) > MAX_TAGS:
                error("tags", f"At most {MAX_TAGS} tags.")

    enabled = data.get("enabled")
    if "enabled" in data and not isinstance(enabled, bool):  # null too: the schema's boolean
        error("enabled", "enabled is true or false (leave it out to keep it as it is).")

    if errors:
        raise ValidationFailed(errors)
    return SubscriptionInput(
        kind=kind,
        name=name,
        event_types=event_types,
        tags=tags,
        enabled=enabled,
        **columns,
    )
