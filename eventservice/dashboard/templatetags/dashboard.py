"""Template helpers of the dashboard: times, status badges, outcomes, durations, JSON, query strings."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.http import QueryDict
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from core import ids
from core.ids import iso_ms
from core.rendering import display_json
from core.secrets import redact_headers
from eventservice.dashboard.outcome import outcome_summary

register = template.Library()


@register.filter
def when(value: datetime | None) -> str:
    """A UTC instant as <time>: localized in the browser by app.js, UTC on hover."""
    if value is None:
        return mark_safe('<span class="muted">—</span>')
    iso = iso_ms(value)
    return format_html(
        '<time datetime="{}" title="{} UTC">{} UTC</time>', iso, iso[:23].replace("T", " "), iso[:19].replace("T", " ")
    )


@register.filter
def when_ms(value: datetime | None) -> str:
    """Like `when`, shown with milliseconds (timelines, where lateness is in ms)."""
    if value is None:
        return mark_safe('<span class="muted">—</span>')
    iso = iso_ms(value)
    return format_html(
        '<time datetime="{}" title="{} UTC" data-ms>{} UTC</time>',
        iso,
        iso[:23].replace("T", " "),
        iso[:23].replace("T", " "),
    )


@register.filter
def badge(status: str) -> str:
    return format_html('<span class="badge badge-{}">{}</span>', str(status).lower(), status)


@register.filter
def outcome(call: Any) -> str:
    """A status page cell: the HTTP status or error kind, and the latency ('HttpError 503 · 17 ms')."""
    summary = outcome_summary(call)
    if summary is None:
        return mark_safe('<span class="muted">—</span>')
    return format_html(
        '{}<span class="outcome outcome-{}">{}</span>{}',
        mark_safe('<span class="muted">last try</span> ') if summary.last_attempt else "",
        "ok" if summary.ok else "bad",
        summary.label,
        format_html(' <span class="latency muted">{}</span>', duration(summary.latency_ms))
        if summary.latency_ms is not None
        else "",
    )


@register.filter
def short_id(value: Any) -> str:
    return ids.short_id(value)


@register.filter
def duration(value: float | int | timedelta | None) -> str:
    """Milliseconds (or a timedelta) for people: '85 ms', '1.25 s', '3 min 5 s'."""
    if value is None:
        return "—"
    try:
        ms = value.total_seconds() * 1000 if isinstance(value, timedelta) else float(value)
    except (TypeError, ValueError):  # a stored outcome without a number here: shown as unknown
        return "—"
    sign = "−" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1000:
        return f"{sign}{ms:.0f} ms"
    if ms < 60_000:
        return f"{sign}{ms / 1000:.2f} s"
    minutes, seconds = divmod(int(ms // 1000), 60)
    if minutes < 60:
        return f"{sign}{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{sign}{hours} h {minutes} min"


@register.filter
def pretty_body(value: Any) -> str:
    """A body for display: JSON pretty-printed, anything else as it is."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return display_json(value)
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):  # not JSON, or deeper than the decoder goes: as it is
        return value
    return display_json(parsed)


@register.filter
def redacted(headers: dict | None) -> list[tuple[str, str]]:
    """Header pairs with secret values replaced: the only way headers reach a page."""
    return list(redact_headers(headers).items())


@register.simple_tag
def query(params: QueryDict, **changes: Any) -> str:
    """The current query string with some parameters replaced (None or '' removes them)."""
    updated = params.copy()
    for name, value in changes.items():
        updated.pop(name, None)
        if value not in (None, ""):
            updated[name] = value
    encoded = updated.urlencode()
    return f"?{encoded}" if encoded else "?"


@register.simple_tag
def query_with(params: QueryDict, name: str, value: str) -> str:
    """The current query string with one more value of a repeatable parameter (a tag link), its
    empty values and the page left out."""
    updated = params.copy()
    kept = [item for item in params.getlist(name) if item and item != value]
    updated.setlist(name, [*kept, value])
    updated.pop("page", None)
    return f"?{updated.urlencode()}"


@register.simple_tag
def query_without(params: QueryDict, name: str, value: str) -> str:
    """The current query string without one value of a repeatable parameter (a tag chip's ×)."""
    updated = params.copy()
    updated.setlist(name, [item for item in params.getlist(name) if item != value])
    updated.pop("page", None)
    encoded = updated.urlencode()
    return f"?{encoded}" if encoded else "?"
