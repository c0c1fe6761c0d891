"""Forms of the dashboard's call pages (the request page, a call's details). They only parse what
a browser sends; the rules of a submission live in orchestration.validation, whose wire-named
errors are mapped back onto the fields. The subscription pages' forms: subscription_forms.py."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.conf import settings

from core.rendering import display_json
from core.secrets import is_secret_header
from execution.egress import header_key
from orchestration.retries import MAX_ATTEMPTS, RetryOn
from orchestration.validation import MAX_BODY_DEPTH, MAX_TIMEOUT_MS, METHODS

# Wire field names (orchestration.validation) -> the control that shows the error.
WIRE_FIELDS = {
    "name": "name",
    "requestSpec.method": "method",
    "requestSpec.url": "url",
    "requestSpec.headers": "headers",
    "requestSpec.body": "body",
    "requestSpec.timeoutMs": "timeout_ms",
    "requestSpec.connection": "connection",
    "dueAt": "due_local",
    "tags": "tags",
    "retryPolicy": "max_attempts",
    "retryPolicy.maxAttempts": "max_attempts",
    "retryPolicy.minBackoffMs": "min_backoff_ms",
    "retryPolicy.maxBackoffMs": "max_backoff_ms",
    "retryPolicy.retryOn": "retry_on",
    "retryPolicy.retryInterrupted": "retry_interrupted",
}

# The API's messages name fields by their wire names ("dueAt must be ...", "requestSpec.body.a
# contains ..."); the page names them as its controls do. The API keeps its own wording
# (orchestration.validation).
PAGE_WORDS = {
    "name": "The name",
    "requestSpec": "The request",
    "requestSpec.method": "Method",
    "method": "Method",
    "requestSpec.url": "The URL",
    "requestSpec.headers": "Headers",
    "headers": "Headers",
    "requestSpec.body": "The body",
    "requestSpec.timeoutMs": "Timeout (ms)",
    "timeoutMs": "Timeout (ms)",
    "requestSpec.connection": "Connection",
    "dueAt": "Due time",
    "tags": "Tags",
    "idempotencyKey": "The form's submission key",
    "retryPolicy.maxAttempts": "Attempts",
    "maxAttempts": "Attempts",
    "retryPolicy.minBackoffMs": "First retry after (ms)",
    "minBackoffMs": "First retry after (ms)",
    "retryPolicy.maxBackoffMs": "Longest wait (ms)",
    "maxBackoffMs": "Longest wait (ms)",
    "retryPolicy.retryOn": "Retry on",
    "retryOn": "Retry on",
    "retryPolicy.retryInterrupted": "Retry interrupted attempts",
    "retryInterrupted": "Retry interrupted attempts",
    "retryPolicy": "The retry policy",
}
# A wire name opening a message, or after "A key in " (orchestration.validation.json_value_error),
# with the path inside its value that such a message adds (".items[0]", '["a b"]').
_WIRE_HEAD = re.compile(
    r"(?P<lead>A key in )?"
    r"(?P<wire>" + "|".join(re.escape(name) for name in sorted(PAGE_WORDS, key=len, reverse=True)) + r")"
    r"(?P<trail>(?:\.[A-Za-z_$][A-Za-z0-9_$-]*|\[(?:\d+|\"(?:[^\"\\]|\\.)*\")\])*)"
    r"(?= )"
)


def _page_words(wire: str, trail: str) -> str:
    label = PAGE_WORDS[wire]
    if not trail:
        return label
    if wire in ("requestSpec.headers", "headers"):  # the path is the header's name
        name = json.loads(trail[1:-1]) if trail.startswith("[") else trail[1:]
        return f"Header {name!r}"
    if wire == "tags" and (index := re.fullmatch(r"\[(\d+)\]", trail)):
        return f"Tag {int(index[1]) + 1}"
    return f"{label} at {trail}"


def page_message(message: str) -> str:
    """A wire-worded message in the page's words: only a wire name opening the message (or the
    value a "A key in ..." message names) is replaced, never one quoted inside it."""
    match = _WIRE_HEAD.match(message)
    if match is None:
        return message
    words = _page_words(match["wire"], match["trail"])
    if match["lead"]:
        words = f"{match['lead']}{words[0].lower()}{words[1:]}"
    rest = message[match.end() :]
    # The one message naming a second field: the retry policy's bounds.
    return words + rest.replace("than maxBackoffMs", "than the longest wait")


_TAG_SPLIT = re.compile(r"[\s,]+")


def split_tags(text: str) -> list[str]:
    return [tag for tag in _TAG_SPLIT.split(text or "") if tag]


# A scheduled time further back than this is said before the call is sent (it runs at once).
PAST_DUE_CONFIRM = timedelta(minutes=1)


def _ago_text(ago: timedelta) -> str:
    seconds = int(ago.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count:,} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"


def past_due_said(due_iso: str) -> str | None:
    """What a page says of a chosen time more than PAST_DUE_CONFIRM ago (the call would run at
    once), or None (later, or not a time: the submission's own check names that)."""
    try:
        due = datetime.fromisoformat(due_iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    ago = datetime.now(UTC) - due if due.tzinfo is not None else timedelta(0)
    return f"That time is {_ago_text(ago)} ago: the call would run at once." if ago > PAST_DUE_CONFIRM else None


class RequestForm(forms.Form):
    """The request page. Header rows arrive as repeated header_name / header_value fields."""

    class BodyFormat:
        JSON = "json"
        TEXT = "text"

    class When:
        NOW = "now"
        SCHEDULE = "schedule"

    name = forms.CharField(required=False, strip=True, widget=forms.TextInput(attrs={"autocomplete": "off"}))
    method = forms.ChoiceField(choices=[(m, m) for m in METHODS], initial="GET")
    url = forms.CharField(
        label="URL",
        required=False,
        strip=True,
        widget=forms.TextInput(attrs={"placeholder": "https://api.example.com/orders", "spellcheck": "false"}),
    )
    # Not a control of its own: it carries the header rows' errors.
    headers = forms.CharField(required=False, widget=forms.HiddenInput)
    body_format = forms.ChoiceField(
        label="Body type",
        choices=[(BodyFormat.JSON, "JSON (application/json)"), (BodyFormat.TEXT, "Text (sent as given)")],
        initial=BodyFormat.JSON,
    )
    body = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "code"}),
    )
    tags = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "billing nightly", "autocomplete": "off"}),
        help_text="Separated by spaces or commas.",
    )
    when = forms.ChoiceField(
        label="Execution",
        required=False,
        choices=[(When.NOW, "Execute now"), (When.SCHEDULE, "Schedule")],
        initial=When.NOW,
        widget=forms.RadioSelect,
    )
    due_local = forms.CharField(
        label="Date and time",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}),
    )
    # Filled by the page's script: the chosen time in UTC, and the browser's offset (minutes
    # west of UTC, as Date.getTimezoneOffset) for a time without one.
    due_at = forms.CharField(required=False, widget=forms.HiddenInput)
    tz_offset = forms.IntegerField(required=False, widget=forms.HiddenInput, min_value=-24 * 60, max_value=24 * 60)
    # Set by the "Send it now" button a time in the past asks for (PAST_DUE_CONFIRM).
    past_ok = forms.BooleanField(required=False, widget=forms.HiddenInput)
    timeout_ms = forms.IntegerField(
        label="Timeout (ms)",
        required=False,
        min_value=1,
        max_value=MAX_TIMEOUT_MS,
        widget=forms.NumberInput(attrs={"placeholder": "30000"}),
    )
    connection = forms.CharField(
        required=False,
        strip=True,
        help_text="One of your connections: each attempt carries its credentials (docs/connections.md).",
        widget=forms.TextInput(attrs={"list": "connection-names", "autocomplete": "off", "spellcheck": "false"}),
    )
    # The retry policy (docs/retries.md): sent only when attempts > 1; bounds are checked by
    # orchestration.retries, whose messages the page shows under these fields.
    max_attempts = forms.IntegerField(
        label="Attempts",
        required=False,
        min_value=1,
        max_value=MAX_ATTEMPTS,
        help_text=f"1 makes one attempt; up to {MAX_ATTEMPTS} retries a failure by the rules below.",
        widget=forms.NumberInput(attrs={"placeholder": "1"}),
    )
    min_backoff_ms = forms.IntegerField(
        label="First retry after (ms)", required=False, widget=forms.NumberInput(attrs={"placeholder": "1000"})
    )
    max_backoff_ms = forms.IntegerField(
        label="Longest wait (ms)", required=False, widget=forms.NumberInput(attrs={"placeholder": "60000"})
    )
    retry_on = forms.MultipleChoiceField(
        label="Retry on",
        required=False,
        choices=[
            (RetryOn.HTTP_5XX, "HTTP 5xx"),
            (RetryOn.HTTP_429, "HTTP 429"),
            (RetryOn.TIMEOUT, "Timeout"),
            (RetryOn.NETWORK_ERROR, "Network error"),
        ],
        initial=list(RetryOn.ALL),
        widget=forms.CheckboxSelectMultiple,
    )
    retry_interrupted = forms.BooleanField(
        label="Retry interrupted attempts (the target may receive a request twice)", required=False
    )
    # A fresh key per rendered form: submitting the same form twice stores one call.
    idempotency_key = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(
        self,
        *args: Any,
        header_rows: list[tuple[str, str]] | None = None,
        secret_names: set[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.header_rows = header_rows or []
        # Headers whose values are secret whatever their name says (sealed in a copied call).
        self.secret_names = secret_names or set()
        # The chosen time is in the past: the page offers to send it now (_check_past).
        self.past_due = False

    @classmethod
    def copy_of(cls, call: Any, *, tags: list[str]) -> RequestForm:
        """An unbound form holding a stored call's request, to change and send as a new call.

        Secret header values are left out (docs/security.md §4): the page never holds them, and
        the rows ask for them again. Carrying them over by reference instead would let a member
        who never saw a secret send it to a URL of their choosing.
        """
        spec = call.request_spec
        # As redact_headers decides: a secret name, or a value stored sealed (a dict).
        secrets = {
            name
            for name, value in (spec.get("headers") or {}).items()
            if isinstance(value, dict) or is_secret_header(name)
        }
        rows = [(name, "" if name in secrets else str(value)) for name, value in (spec.get("headers") or {}).items()]
        body = spec.get("body")
        if body is None:
            body_format, body_text = cls.BodyFormat.JSON, ""
        elif isinstance(body, str):  # a string is sent as it is
            body_format, body_text = cls.BodyFormat.TEXT, body
        else:
            body_format, body_text = cls.BodyFormat.JSON, display_json(body)
        timeout = spec.get("timeoutMs")
        initial = {
            "name": call.name,
            "method": spec["method"],
            "url": spec["url"],
            "body_format": body_format,
            "body": body_text,
            "tags": " ".join(tags),
            "when": cls.When.NOW,
            "timeout_ms": timeout if timeout != settings.EXECUTION_TIMEOUT_MS else None,
            "connection": spec.get("connection") or "",
            "idempotency_key": cls.new_idempotency_key(),
        }
        if policy := call.retry_policy:
            initial.update(
                max_attempts=policy.get("maxAttempts"),
                min_backoff_ms=policy.get("minBackoffMs"),
                max_backoff_ms=policy.get("maxBackoffMs"),
                retry_on=policy.get("retryOn"),
                retry_interrupted=policy.get("retryInterrupted", False),
            )
        return cls(initial=initial, header_rows=rows, secret_names=secrets)

    ADVANCED = (
        "timeout_ms",
        "connection",
        "max_attempts",
        "min_backoff_ms",
        "max_backoff_ms",
        "retry_on",
        "retry_interrupted",
    )

    @property
    def advanced_open(self) -> bool:
        """Show the Advanced section when it holds an error or a value that is not the default."""
        if any(self[name].errors for name in self.ADVANCED):
            return True
        attempts = self["max_attempts"].value()
        return bool(self["timeout_ms"].value()) or str(attempts or "1").strip() not in ("", "1")

    @staticmethod
    def new_idempotency_key() -> str:
        return f"dashboard-{uuid.uuid4()}"

    @staticmethod
    def rows_from(data) -> list[tuple[str, str]]:
        names = data.getlist("header_name")
        values = data.getlist("header_value")
        values += [""] * (len(names) - len(values))
        return [(name.strip(), value) for name, value in zip(names, values, strict=False)]

    def display_rows(self) -> list[dict[str, Any]]:
        """Header rows to render: secret values are never echoed back into the page."""
        rows = []
        for name, value in self.header_rows:
            if not (name or value):
                continue
            secret = is_secret_header(name) or name in self.secret_names
            rows.append({"name": name, "value": "" if secret else value, "secret": secret})
        return rows or [{"name": "", "value": "", "secret": False}]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        seen: set[str] = set()
        for name, value in self.header_rows:
            if not name and value:
                self.add_error("headers", "A header row has a value but no name.")
            elif name and header_key(name) in seen:  # as receivers compare names (validation.py)
                self.add_error("headers", f"Header {name!r} is given twice.")
            seen.add(header_key(name))
        if cleaned.get("body_format") == self.BodyFormat.JSON and (cleaned.get("body") or "").strip():
            try:
                cleaned["body_value"] = json.loads(cleaned["body"])
            except ValueError as exc:
                self.add_error("body", f"The body is not valid JSON: {exc}.")
            except RecursionError:  # deeper than the decoder goes; shallower ones get the same rule
                self.add_error("body", f"The body is nested deeper than {MAX_BODY_DEPTH} levels.")
        if cleaned.get("when") == self.When.SCHEDULE:
            try:
                cleaned["due_iso"] = self._due_iso(cleaned)
            except ValueError as exc:
                self.add_error("due_local", str(exc))
            else:
                self._check_past(cleaned)
        return cleaned

    def _check_past(self, cleaned: dict[str, Any]) -> None:
        """A due time more than PAST_DUE_CONFIRM ago runs the call at once (as the API does):
        said before sending, and sent only once confirmed (the "Send it now" button)."""
        said = past_due_said(cleaned["due_iso"])
        if said and not cleaned.get("past_ok"):
            self.past_due = True
            self.add_error("due_local", f"{said} Choose a later time, or send it now.")

    @staticmethod
    def _due_iso(cleaned: dict[str, Any]) -> str:
        if cleaned.get("due_at"):
            return cleaned["due_at"]
        local = cleaned.get("due_local") or ""
        if not local:
            raise ValueError("Choose the date and time to run the call.")
        try:
            naive = datetime.fromisoformat(local)
        except ValueError:
            raise ValueError("Give the date and time as YYYY-MM-DDTHH:MM.") from None
        if naive.tzinfo is not None:
            return naive.isoformat()
        # Date.getTimezoneOffset() is UTC minus local time, in minutes.
        offset = timedelta(minutes=cleaned.get("tz_offset") or 0)
        return (naive + offset).replace(tzinfo=UTC).isoformat()

    def wire_data(self) -> dict[str, Any]:
        """The submission in the API's wire shape, for orchestration.validation.

        Built from whatever parsed, even when some field did not: the domain's checks of the
        other fields then run too, so every mistake is shown at once.
        """
        cleaned = getattr(self, "cleaned_data", {})
        body_text = cleaned.get("body") or ""
        if not body_text.strip():
            body = None
        elif cleaned.get("body_format") == self.BodyFormat.JSON:
            body = cleaned.get("body_value")
        else:
            body = body_text
        spec: dict[str, Any] = {
            "method": cleaned.get("method") or "GET",
            "url": cleaned.get("url") or "",
            "headers": {name: value for name, value in self.header_rows if name},
            "body": body,
        }
        if cleaned.get("timeout_ms") is not None:
            spec["timeoutMs"] = cleaned["timeout_ms"]
        if cleaned.get("connection"):
            spec["connection"] = cleaned["connection"]
        data: dict[str, Any] = {
            "name": cleaned.get("name") or "",
            "requestSpec": spec,
            "tags": split_tags(cleaned.get("tags") or ""),
        }
        if cleaned.get("due_iso"):
            data["dueAt"] = cleaned["due_iso"]
        if cleaned.get("idempotency_key"):
            data["idempotencyKey"] = cleaned["idempotency_key"]
        if (cleaned.get("max_attempts") or 1) > 1:
            policy: dict[str, Any] = {
                "maxAttempts": cleaned["max_attempts"],
                "retryOn": list(cleaned.get("retry_on") or []),
                "retryInterrupted": bool(cleaned.get("retry_interrupted")),
            }
            for field, wire in (("min_backoff_ms", "minBackoffMs"), ("max_backoff_ms", "maxBackoffMs")):
                if cleaned.get(field) is not None:
                    policy[wire] = cleaned[field]
            data["retryPolicy"] = policy
        return data

    def add_wire_errors(self, errors: dict[str, list[str]]) -> None:
        for wire_name, messages in errors.items():
            field = WIRE_FIELDS.get(wire_name)
            for message in map(page_message, messages):
                if field is not None and message in self.errors.get(field, []):
                    continue
                self.add_error(field, message)


class RerunForm(forms.Form):
    """The details page's 'Run again': now, or at a time chosen in the browser's time zone (the
    page's script sends it in UTC too, as the request page's schedule does)."""

    when = forms.ChoiceField(
        required=False,
        choices=[(RequestForm.When.NOW, "Now"), (RequestForm.When.SCHEDULE, "At a chosen time")],
    )
    due_local = forms.CharField(
        label="Run at",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}),
    )
    due_at = forms.CharField(required=False, widget=forms.HiddenInput)
    tz_offset = forms.IntegerField(required=False, widget=forms.HiddenInput, min_value=-24 * 60, max_value=24 * 60)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if cleaned.get("when") == RequestForm.When.SCHEDULE:
            try:
                cleaned["due_iso"] = RequestForm._due_iso(cleaned)
            except ValueError as exc:
                self.add_error("due_local", str(exc))
            else:
                if said := past_due_said(cleaned["due_iso"]):
                    self.add_error("due_local", f"{said} Choose a later time, or use Run again.")
        return cleaned

    def wire_data(self) -> dict[str, Any]:
        """The rerun's body in the API's wire shape, for orchestration.validation.validate_rerun."""
        due = getattr(self, "cleaned_data", {}).get("due_iso")
        return {"dueAt": due} if due else {}


class TagsForm(forms.Form):
    tags = forms.CharField(required=False, max_length=2000)


class FavoriteForm(forms.Form):
    favorite = forms.BooleanField(required=False)
