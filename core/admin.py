"""Display helpers shared by the apps' admins."""

from __future__ import annotations

from django.utils.html import format_html, format_html_join

from core.secrets import redact_headers


def headers_table(headers) -> str:
    pairs = redact_headers(headers).items()
    if not pairs:
        return "—"
    return format_html(
        "<table>{}</table>",
        format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", pairs),
    )
