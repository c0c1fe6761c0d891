"""The Connections pages (docs/connections.md): the current tenant's named credentials, made,
changed (a secret rotated) and deleted. A secret is typed into a password field and never shown
again, on no page. Thin: execution.connections checks and stores, exactly as for the API; its
wire-named errors are shown beside the fields of the same names."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from core.errors import Conflict, NotFound, ValidationFailed
from eventservice.dashboard.tenancy import tenant_required
from execution.connections import (
    CLIENT_AUTH,
    SECRET,
    SHOWN,
    Kind,
    connection_create,
    connection_delete,
    connection_get,
    connection_update,
    connection_wire,
    connections_list,
    validate_connection,
)
from execution.models import Connection

# The form's fields, each kind's shown ones and secrets, by their wire names.
KIND_FIELDS = {kind: (*SHOWN[kind][0], *SHOWN[kind][1], SECRET[kind]) for kind in Kind.values}
SECRET_FIELDS = set(SECRET.values())
LABELS = {
    "username": ("User name", ""),
    "password": ("Password", ""),
    "headerName": ("Header name", "Each attempt carries this header, e.g. X-Api-Key."),
    "headerValue": ("Header value", ""),
    "tokenUrl": ("Token URL", "The token endpoint the agent asks for a bearer token (client-credentials grant)."),
    "clientId": ("Client id", ""),
    "clientSecret": ("Client secret", ""),
    "scope": ("Scope", "Optional: scopes separated by spaces."),
    "audience": ("Audience", "Optional: the audience some token endpoints ask for."),
    "clientAuth": ("Client authentication", "HTTP Basic (the default), or the id and secret in the form body."),
}
KIND_HINTS = {
    Kind.BASIC: "A user name and a password, sent as HTTP Basic.",
    Kind.API_KEY_HEADER: "A header and its value, e.g. an API key.",
    Kind.OAUTH2_CLIENT_CREDENTIALS: "A bearer token the agent fetches from a token endpoint, kept until it expires.",
}


def _fields(kind: str, *, posted: dict[str, Any], errors: dict[str, list[str]], change: bool) -> list[dict[str, Any]]:
    """What the template shows of each field of `kind`: label, hint, value typed, errors."""
    required = SHOWN[kind][0]
    return [
        {
            "name": field,
            "label": LABELS[field][0],
            "hint": LABELS[field][1],
            "secret": field in SECRET_FIELDS,
            "required": field in required or (not change and field in SECRET_FIELDS),
            "value": "" if field in SECRET_FIELDS else posted.get(field) or "",
            "choices": CLIENT_AUTH if field == "clientAuth" else None,
            "errors": errors.get(field, []),
        }
        for field in KIND_FIELDS[kind]
    ]


def _posted(request: HttpRequest, kind: str, *, change: bool) -> dict[str, Any]:
    """The wire shape of what the form sent for `kind`. An optional field left empty is none (on a
    change: cleared); the secret left empty on a change keeps the one the connection has."""
    required, optional = SHOWN.get(kind, ((), ()))
    data: dict[str, Any] = {field: request.POST.get(field, "").strip() for field in required}
    data.update({field: request.POST.get(field, "").strip() or None for field in optional})
    if not change:
        data = {field: value for field, value in data.items() if value is not None}
    secret = request.POST.get(SECRET[kind], "") if kind in SECRET else ""
    if secret or (not change and kind in SECRET):
        data[SECRET[kind]] = secret
    return data


def _connection(request: HttpRequest, name: str) -> Connection:
    try:
        return connection_get(tenant_id=request.tenant.id, name=name)
    except NotFound:
        raise Http404("No such connection.") from None


def _detail_url(connection: Connection) -> str:
    return reverse("dashboard:connection-detail", kwargs={"name": connection.name})


def _list_context(
    request: HttpRequest, *, posted: dict[str, Any] | None = None, errors: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    posted, errors = posted or {}, errors or {}
    return {
        "connections": connections_list(tenant_id=request.tenant.id),
        "kinds": [
            {
                "value": kind,
                "hint": KIND_HINTS[kind],
                "checked": posted.get("kind") == kind,
                "fields": _fields(kind, posted=posted, errors=errors, change=False),
            }
            for kind in Kind.values
        ],
        "posted": posted,
        "errors": errors,
    }


@never_cache
@tenant_required
@require_http_methods(["GET", "POST"])
def connections_page(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return render(request, "dashboard/connections.html", _list_context(request))
    kind = request.POST.get("kind", "")
    data = {"name": request.POST.get("name", "").strip(), "kind": kind, **_posted(request, kind, change=False)}
    try:
        connection = connection_create(tenant_id=request.tenant.id, data=validate_connection(data))
    except (ValidationFailed, Conflict) as exc:
        errors = exc.errors if isinstance(exc, ValidationFailed) else {"name": [exc.detail]}
        # What was typed comes back, but never a secret.
        posted = {key: value for key, value in data.items() if key not in SECRET_FIELDS}
        context = _list_context(request, posted=posted, errors=errors)
        return render(request, "dashboard/connections.html", context, status=400)
    messages.success(request, f"Connection “{connection.name}” made; its secret is kept sealed and not shown again.")
    return HttpResponseRedirect(_detail_url(connection))


@never_cache
@tenant_required
@require_http_methods(["GET", "POST"])
def connection_detail(request: HttpRequest, name: str) -> HttpResponse:
    connection = _connection(request, name)
    shown = connection_wire(connection)  # the shown fields, by their wire names

    def context(errors: dict[str, list[str]], posted: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "connection": connection,
            "facts": [(LABELS[f][0], shown[f]) for f in KIND_FIELDS[connection.kind] if f not in SECRET_FIELDS],
            "fields": _fields(connection.kind, posted=posted or shown, errors=errors, change=True),
            "errors": errors,
        }

    if request.method == "GET":
        return render(request, "dashboard/connection_detail.html", context({}))
    data = _posted(request, connection.kind, change=True)
    try:
        connection = connection_update(
            tenant_id=request.tenant.id, name=name, data=validate_connection(data, existing=connection)
        )
    except ValidationFailed as exc:
        return render(request, "dashboard/connection_detail.html", context(exc.errors, data), status=400)
    rotated = " Its new secret is used from the next attempt." if SECRET[connection.kind] in data else ""
    messages.success(request, f"Connection “{connection.name}” changed.{rotated}")
    return HttpResponseRedirect(_detail_url(connection))


@tenant_required
@require_POST
def connection_delete_view(request: HttpRequest, name: str) -> HttpResponse:
    connection = _connection(request, name)
    try:
        connection_delete(tenant_id=request.tenant.id, name=connection.name)
    except Conflict as exc:
        messages.error(request, f"Not deleted. {exc.detail}")
        return HttpResponseRedirect(_detail_url(connection))
    messages.success(request, f"Connection “{connection.name}” deleted.")
    return HttpResponseRedirect(reverse("dashboard:connections"))
