"""Display helpers shared by the apps' admins."""

from __future__ import annotations

from django.http import HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
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


def shown_once_response(request, *, context: dict, title: str, secret: str, next_url: str) -> HttpResponse:
    """The page after an admin add that made a secret (an API key, a webhook's signing secret):
    the secret shown this once, in this response alone. Not an admin message: messages rest in
    the session table (SessionStorage) until the next page is loaded, readable by anyone who
    reads the database; and answered with Cache-Control: no-store, so no cache keeps it either
    (docs/security.md, "Secrets shown once")."""
    response = TemplateResponse(
        request, "admin/shown_once.html", {**context, "title": title, "secret": secret, "next_url": next_url}
    )
    add_never_cache_headers(response)
    return response


class ShownOnceMixin:
    """An admin whose add makes a secret (its save_model sets `request.shown_once`): the answer
    to the add is the shown-once page (shown_once_response), then the object's change page."""

    def shown_once_title(self, obj) -> str:
        raise NotImplementedError

    def response_add(self, request, obj, post_url_continue=None):
        secret = getattr(request, "shown_once", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        return shown_once_response(
            request,
            context=self.admin_site.each_context(request),
            title=self.shown_once_title(obj),
            secret=secret,
            next_url=reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk]),
        )
