"""NATS subjects for event delivery (docs/events.md): the stream's subjects, subject templates
and message ids, and the servers of NATS_URL, as pure rules (what the settings, the API, the
admin and the health answer need, with no connection and no nats-py, whose import costs every
process a fifth of a second). The publisher that sends on them is delivery/nats.py."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# The stream's subjects for a template without a fixed first token (docs/events.md, "NATS
# JetStream"; otherwise stream_subjects_of): agents sharing one NATS server each take their own.
DEFAULT_STREAM_SUBJECTS = ("serviceagent.>",)
DEFAULT_SUBJECT_TEMPLATE = "serviceagent.{tenantId}.{type}"
SUBJECT_TEMPLATE_MAX_LENGTH = 200

# The envelope keys a template may use; a placeholder is named after its key.
PLACEHOLDERS = ("tenantId", "type", "aggregateId")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_UNSAFE_IN_TOKEN = re.compile(r"[^A-Za-z0-9_-]")
_SAMPLE_ENVELOPE = {
    "tenantId": "acme",
    "type": "ServiceCallSucceeded",
    "aggregateId": "0190c2a4-7b1e-7cc0-8a4e-3f1d2b9c0d11",
}


def stream_subjects_of(template: str) -> tuple[str, ...]:
    """The stream's subjects unless NATS_STREAM_SUBJECTS says otherwise: DEFAULT_STREAM_SUBJECTS
    when the template's subjects fall inside them (as every agent's did before), else the
    template's first token and '>' (`billing.{tenantId}.{type}` takes `billing.>`), so an agent
    given a template of its own takes subjects of its own on a shared NATS server. A template
    whose first token is a placeholder has none: DEFAULT_STREAM_SUBJECTS (and the start says
    the template falls outside them)."""
    if validate_subject_template(template, stream_subjects=DEFAULT_STREAM_SUBJECTS) is None:
        return DEFAULT_STREAM_SUBJECTS
    first, _, rest = template.partition(".")
    if _PLACEHOLDER.search(first) or not _TOKEN.fullmatch(first):
        return DEFAULT_STREAM_SUBJECTS
    return (f"{first}.>",) if rest else (first,)


def subject_for(template: str, envelope: Mapping[str, Any]) -> str:
    """The subject an event goes to: `template` with {tenantId}, {type} and {aggregateId} filled
    in from the envelope, each value made one safe subject token (see `_token`).

    Raises ValueError for an unknown or malformed placeholder, or a template whose fixed part
    makes an invalid subject; never for the event's values, so no event is undeliverable.
    """
    subject = _render(template, envelope)
    error = _subject_error(subject)
    if error:
        raise ValueError(error)
    return subject


def validate_subject_template(template: str, *, stream_subjects: Sequence[str]) -> str | None:
    """Why a subject template is refused (one sentence for a 400 or a setting), or None when it
    is fine: every subject it can make must fall inside the stream's subjects."""
    if not isinstance(template, str) or not 1 <= len(template) <= SUBJECT_TEMPLATE_MAX_LENGTH:
        return f"the subject template must be 1 to {SUBJECT_TEMPLATE_MAX_LENGTH} characters"
    try:
        subject = _render(template, _SAMPLE_ENVELOPE)
    except ValueError as error:
        return str(error)
    error = _subject_error(subject)
    if error:
        return error
    # Each token with a placeholder stands for any token ('*'): `serviceagent.{tenantId}.x`
    # falls inside `serviceagent.>`, not inside `serviceagent.acme.>`.
    every = ".".join("*" if _PLACEHOLDER.search(token) else token for token in template.split("."))
    if not any(subject_covers(pattern, every) for pattern in stream_subjects):
        shown = (
            f"the subject {subject!r} falls" if every == subject else f"its subjects {every!r} ('*': any value) fall"
        )
        return f"{shown} outside the stream's subjects ({', '.join(stream_subjects)})"
    return None


def validate_stream_subjects(subjects: Sequence[str]) -> str | None:
    """Why a stream's subjects are refused (one sentence), or None: at least one, each a subject
    of tokens of letters, digits, '-' and '_', or the wildcards '*' (one token) and '>' (the
    last, for one token or more), and none already covered by another."""
    if not subjects:
        return "name at least one subject (e.g. serviceagent.>)"
    for subject in subjects:
        tokens = subject.split(".")
        if not all(_TOKEN.fullmatch(token) or token == "*" for token in tokens[:-1]) or not (
            _TOKEN.fullmatch(tokens[-1]) or tokens[-1] in ("*", ">")
        ):
            return (
                f"{subject!r} is not a subject: its dot-separated tokens must be non-empty and use only "
                "letters, digits, '-' and '_', or be '*' (any one token) or a last '>' (one token or more)"
            )
    for index, subject in enumerate(subjects):
        for other in [*subjects[:index], *subjects[index + 1 :]]:
            if subject_covers(other, subject):
                return f"{subject!r} is already covered by {other!r} (a subject once is enough)"
    return None


def subject_covers(pattern: str, subject: str) -> bool:
    """Whether every subject `subject` matches (it may hold wildcards itself) also matches
    `pattern`: `serviceagent.>` covers `serviceagent.acme.*`, not `serviceagent`."""
    have, want = pattern.split("."), subject.split(".")
    for index, token in enumerate(have):
        if token == ">":
            return len(want) > index  # '>' stands for one token or more
        if index >= len(want) or want[index] == ">":
            return False
        if token != "*" and token != want[index]:
            return False
    return len(have) == len(want)


def _render(template: str, envelope: Mapping[str, Any]) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in PLACEHOLDERS:
            known = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
            raise ValueError(f"unknown placeholder {{{name}}} in the subject template (known: {known})")
        return _token(envelope.get(name))

    subject = _PLACEHOLDER.sub(fill, template)
    if "{" in subject or "}" in subject:  # values never hold braces: _token replaced them
        raise ValueError("unbalanced '{' or '}' in the subject template")
    return subject


def _token(value: Any) -> str:
    """A value as exactly one subject token. Tenant slugs, event types and UUIDs pass unchanged;
    anything else outside [A-Za-z0-9_-] becomes '_' ('.' would split the token, '*' and '>' are
    wildcards, spaces end the subject), and a missing or empty value becomes '_'."""
    if value is None or value == "":
        return "_"
    return _UNSAFE_IN_TOKEN.sub("_", str(value))


def _subject_error(subject: str) -> str | None:
    if not all(_TOKEN.fullmatch(token) for token in subject.split(".")):
        return (
            f"the subject {subject!r} is invalid: its dot-separated tokens must be non-empty and "
            "use only letters, digits, '-' and '_'"
        )
    return None


def valid_msg_id(msg_id: str) -> bool:
    """Whether `msg_id` can go in a Nats-Msg-Id header: printable, no spaces, not empty."""
    return bool(msg_id) and msg_id.isprintable() and " " not in msg_id


def nats_servers(url: str) -> list[str]:
    """The servers of a NATS_URL (several, comma-separated, for a cluster)."""
    return [server.strip() for server in url.split(",") if server.strip()]


def without_credentials(server: str) -> str:
    """A server's URL without its user:password@, for logs and pages."""
    return re.sub(r"//[^@/]*@", "//", server)
