"""Forms of the dashboard. They only parse what a browser sends; the rules of a submission
live in orchestration.validation, whose wire-named errors are mapped back onto the fields."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms

from core.secrets import is_secret_header
from orchestration.validation import MAX_BODY_DEPTH, MAX_TIMEOUT_MS, METHODS

# Wire field names (orchestration.validation) -> the control that shows the error.
WIRE_FIELDS = {
    "name": "name",
    "requestSpec.method": "method",
    "requestSpec.url": "url",
    "requestSpec.headers": "headers",
    "requestSpec.body": "body",
    "requestSpec.timeoutMs": "timeout_ms",
    "dueAt": "due_local",
    "tags": "tags",
}

_TAG_SPLIT = re.compile(r"[\s,]+")


def split_tags(text: str) -> list[str]:
    return [tag for tag in _TAG_SPLIT.split(text or "") if tag]


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
    timeout_ms = forms.IntegerField(
        label="Timeout (ms)",
        required=False,
        min_value=1,
        max_value=MAX_TIMEOUT_MS,
        widget=forms.NumberInput(attrs={"placeholder": "30000"}),
    )
    # A fresh key per rendered form: submitting the same form twice stores one call.
    idempotency_key = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, header_rows: list[tuple[str, str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_rows = header_rows or []

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
        rows = [
            {"name": name, "value": "" if is_secret_header(name) else value, "secret": is_secret_header(name)}
            for name, value in self.header_rows
            if name or value
        ]
        return rows or [{"name": "", "value": "", "secret": False}]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        seen: set[str] = set()
        for name, value in self.header_rows:
            if not name and value:
                self.add_error("headers", "A header row has a value but no name.")
            elif name and name.lower() in seen:
                self.add_error("headers", f"Header {name!r} is given twice.")
            seen.add(name.lower())
        if cleaned.get("body_format") == self.BodyFormat.JSON and (cleaned.get("body") or "").strip():
            try:
                cleaned["body_value"] = json.loads(cleaned["body"])
            except ValueError as exc:
                self.add_error("body", f"The body is not valid JSON: {exc}.")
            except RecursionError:  # deeper than the decoder goes; shallower ones get the same rule
                self.add_error("body", f"requestSpec.body is nested deeper than {MAX_BODY_DEPTH} levels.")
        if cleaned.get("when") == self.When.SCHEDULE:
            try:
                cleaned["due_iso"] = self._due_iso(cleaned)
            except ValueError as exc:
                self.add_error("due_local", str(exc))
        return cleaned

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
        data: dict[str, Any] = {
            "name": cleaned.get("name") or "",
            "requestSpec": spec,
            "tags": split_tags(cleaned.get("tags") or ""),
        }
        if cleaned.get("due_iso"):
            data["dueAt"] = cleaned["due_iso"]
        if cleaned.get("idempotency_key"):
            data["idempotencyKey"] = cleaned["idempotency_key"]
        return data

    def add_wire_errors(self, errors: dict[str, list[str]]) -> None:
        for wire_name, messages in errors.items():
            field = WIRE_FIELDS.get(wire_name)
            for message in messages:
                if field is not None and message in self.errors.get(field, []):
                    continue
                self.add_error(field, message)


class TagsForm(forms.Form):
    tags = forms.CharField(required=False, max_length=2000)


class FavoriteForm(forms.Form):
    favorite = forms.BooleanField(required=False)
