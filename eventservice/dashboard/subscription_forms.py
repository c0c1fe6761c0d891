"""Forms of the dashboard's subscription pages. They only parse what a browser sends; the rules
of a subscription live in delivery.validation, whose wire-named errors are mapped back onto the
fields."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms

from delivery.channels import DEFAULT_KIND
from delivery.validation import EVENT_TYPES

# Wire field names (delivery.validation) -> the control that shows the error.
SUBSCRIPTION_WIRE_FIELDS = {
    "name": "name",
    "url": "url",
    "eventTypes": "event_types",
    "tags": "tags",
    "enabled": "enabled",
}


class SubscriptionForm(forms.Form):
    """A tenant's new webhook subscription."""

    name = forms.CharField(required=False, strip=False, widget=forms.TextInput(attrs={"autocomplete": "off"}))
    url = forms.CharField(
        label="URL",
        required=False,
        strip=True,
        widget=forms.TextInput(attrs={"placeholder": "https://hooks.example.com/service-agent", "spellcheck": "false"}),
    )
    event_types = forms.MultipleChoiceField(
        label="Event types",
        required=False,
        choices=[(event_type, event_type) for event_type in EVENT_TYPES],
        widget=forms.CheckboxSelectMultiple,
        help_text="None checked: every event type, including ones added later.",
    )
    tags = forms.CharField(
        label="Call tags",
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "billing nightly", "spellcheck": "false", "autocomplete": "off"}),
        help_text="Space-separated: only the events of calls carrying one of these tags. Empty: every call's.",
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def wire_data(self) -> dict[str, Any]:
        """The subscription in the API's wire shape, for delivery.validation (built from whatever
        parsed, so that every mistake is shown at once)."""
        cleaned = getattr(self, "cleaned_data", {})
        return {
            "kind": DEFAULT_KIND,
            "name": cleaned.get("name") or "",
            "url": cleaned.get("url") or "",
            "eventTypes": list(cleaned.get("event_types") or []),
            "tags": (cleaned.get("tags") or "").split(),
            "enabled": bool(cleaned.get("enabled")),
        }

    def add_wire_errors(self, errors: dict[str, list[str]]) -> None:
        for wire_name, messages in errors.items():
            field = SUBSCRIPTION_WIRE_FIELDS.get(wire_name)
            for message in messages:
                if field is not None and message in self.errors.get(field, []):
                    continue
                self.add_error(field, message)


class SubscriptionEnabledForm(forms.Form):
    enabled = forms.TypedChoiceField(choices=[("true", "enable"), ("false", "disable")], coerce=lambda v: v == "true")


class RecoverForm(forms.Form):
    """Requeue a subscription's FAILED and EXPIRED deliveries of events since a time, chosen in
    the browser's time zone: the page's script sends it in UTC too (`since`), with the browser's
    offset as the fallback for a time without one (as the request page's schedule)."""

    since_local = forms.CharField(
        label="Since",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}),
    )
    since = forms.CharField(required=False, widget=forms.HiddenInput)
    tz_offset = forms.IntegerField(required=False, widget=forms.HiddenInput, min_value=-24 * 60, max_value=24 * 60)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        try:
            cleaned["since_at"] = self._since(cleaned)
        except ValueError as exc:
            self.add_error("since_local", str(exc))
        return cleaned

    @staticmethod
    def _since(cleaned: dict[str, Any]) -> datetime:
        if cleaned.get("since"):
            try:
                value = datetime.fromisoformat(cleaned["since"].replace("Z", "+00:00"))
            except ValueError:
                raise ValueError("Give the time as YYYY-MM-DDTHH:MM.") from None
            if value.tzinfo is not None:
                return value.astimezone(UTC)
        local = cleaned.get("since_local") or ""
        if not local:
            raise ValueError("Choose the time to recover from.")
        try:
            naive = datetime.fromisoformat(local)
        except ValueError:
            raise ValueError("Give the time as YYYY-MM-DDTHH:MM.") from None
        if naive.tzinfo is not None:
            return naive.astimezone(UTC)
        # Date.getTimezoneOffset() is UTC minus local time, in minutes.
        return (naive + timedelta(minutes=cleaned.get("tz_offset") or 0)).replace(tzinfo=UTC)
