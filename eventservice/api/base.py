"""The base of every tenant-scoped API view: who is calling, for which tenant; and of the views
of a tenant's collections (calls, schedules, subscriptions): pages of it, items by id.

A caller sees a tenant's resources only as that tenant (its API key) or as a member (a
browser session); anyone else gets 404, never 403, so nothing reveals what exists.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.utils.urls import remove_query_param, replace_query_param
from rest_framework.views import APIView

from core.errors import NotFound, ValidationFailed
from tenants.authentication import ApiKeyPrincipal
from tenants.selectors import user_can_access_tenant

_BODY_METHODS = {"POST", "PUT", "PATCH"}


def caller_may_act_for(user: Any, tenant_id: str) -> bool:
    if isinstance(user, ApiKeyPrincipal):
        return user.tenant_id == tenant_id
    return user_can_access_tenant(user=user, tenant_id=tenant_id)


# Accept headers that DRF's negotiation answers with the first renderer and its own media type
# when that renderer is JSON (absent means */*).
_PLAIN_ACCEPT = frozenset({"*/*", "application/json"})


class TenantApiView(APIView):
    """Resolves `tenant_id` from the path after authentication; sets `self.tenant_id`."""

    tenant_id: str

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[Any, str]:
        # What clients send (no Accept, */*, application/json; no format override) is answered
        # without DRF's parsing of the header; anything else is negotiated by DRF as before.
        if (
            not self.format_kwarg
            and request.META.get("HTTP_ACCEPT", "*/*") in _PLAIN_ACCEPT
            and api_settings.URL_FORMAT_OVERRIDE not in request.query_params
        ):
            renderer_class = self.renderer_classes[0] if self.renderer_classes else None
            if renderer_class is not None and renderer_class.media_type == "application/json":
                return renderer_class(), renderer_class.media_type
        return super().perform_content_negotiation(request, force)

    def check_throttles(self, request: Request) -> None:
        # DRF checks them right after the permissions; here they wait for the tenant (initial).
        if hasattr(self, "tenant_id"):
            super().check_throttles(request)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication (401) and permissions
        tenant_id = kwargs.get("tenant_id", "")
        if not caller_may_act_for(request.user, tenant_id):
            raise NotFound(f"Tenant {tenant_id!r} not found.")
        self.tenant_id = tenant_id
        # Now that the caller may act for the tenant: its ceilings (eventservice/api/throttles.py).
        self.check_throttles(request)
        if request.method in _BODY_METHODS:
            # Django checks DATA_UPLOAD_MAX_MEMORY_SIZE only when `.body` is read; DRF would
            # stream the body past it. Reading it here turns an oversized body into 413.
            request._request.body  # noqa: B018


# --- Cursor (keyset) pagination over UUID v7 ids, newest first --------------------------------

DEFAULT_LIMIT = 25
MAX_LIMIT = 200


@dataclass(frozen=True)
class Cursor:
    """`n:<id>`: the page after (older than) id; `p:<id>`: the page before (newer than) id."""

    direction: str
    pivot: uuid.UUID

    def encode(self) -> str:
        return base64.urlsafe_b64encode(f"{self.direction}:{self.pivot.hex}".encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, raw: str) -> Cursor:
        try:
            text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
            direction, pivot = text.split(":", 1)
            if direction not in ("n", "p"):
                raise ValueError(direction)
            return cls(direction, uuid.UUID(hex=pivot))
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise ValueError("The cursor is not valid; use the next or previous link as given.") from None


def parse_limit(raw: str | None, *, default: int, maximum: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"limit must be an integer from 1 to {maximum}.") from None
    if not 1 <= value <= maximum:
        raise ValueError(f"limit must be an integer from 1 to {maximum}.")
    return value


@dataclass
class Page:
    items: list[Any]
    next: str | None
    previous: str | None


def paging_params(request: Request, *, errors: dict[str, list[str]] | None = None) -> tuple[int, Cursor | None]:
    """Read and check `limit` and `cursor`; raises ValidationFailed (400) on bad values, naming
    after `errors` (what the view found wrong before: a filter's) the paging ones, if any."""
    errors = dict(errors or {})
    limit = DEFAULT_LIMIT
    try:
        limit = parse_limit(request.query_params.get("limit"), default=DEFAULT_LIMIT, maximum=MAX_LIMIT)
    except ValueError as exc:
        errors["limit"] = [str(exc)]
    cursor = None
    raw = request.query_params.get("cursor")
    if raw:
        try:
            cursor = Cursor.decode(raw)
        except ValueError as exc:
            errors["cursor"] = [str(exc)]
    if errors:
        raise ValidationFailed(errors)
    return limit, cursor


def keyset_page(queryset: Any, request: Request, *, limit: int, cursor: Cursor | None, key: str = "pk") -> Page:
    """One page of `queryset` newest first by `key` (a UUID v7), with next/previous URLs.

    The WHERE on the key keeps every page an index range scan however deep it is.
    """
    if cursor is not None and cursor.direction == "p":
        rows = list(queryset.filter(**{f"{key}__gt": cursor.pivot}).order_by(key)[: limit + 1])
        more_newer = len(rows) > limit
        items = list(reversed(rows[:limit]))
        previous = Cursor("p", _key(items[0], key)) if (items and more_newer) else None
        following = Cursor("n", _key(items[-1], key)) if items else Cursor("n", cursor.pivot)
    else:
        qs = queryset
        if cursor is not None:
            qs = qs.filter(**{f"{key}__lt": cursor.pivot})
        rows = list(qs.order_by(f"-{key}")[: limit + 1])
        items = rows[:limit]
        following = Cursor("n", _key(items[-1], key)) if len(rows) > limit else None
        if cursor is None:
            previous = None
        else:
            previous = Cursor("p", _key(items[0], key)) if items else Cursor("p", cursor.pivot)
    return Page(items=items, next=_page_url(request, following), previous=_page_url(request, previous))


def _key(item: Any, key: str) -> uuid.UUID:
    return getattr(item, "pk" if key == "pk" else key)


def _page_url(request: Request, cursor: Cursor | None) -> str | None:
    if cursor is None:
        return None
    url = request.build_absolute_uri()
    url = remove_query_param(url, "cursor")
    return replace_query_param(url, "cursor", cursor.encode())


class TenantCollectionApi(TenantApiView):
    """A view of one of the tenant's collections: a page of it, or an item named in the path.

    Items are read through selectors that take `self.tenant_id`, so another tenant's item
    answers 404 like one that does not exist; so does an id that is not a UUID (`item_id`).
    """

    # Names an item in a 404: "Service call abc not found."
    item_name = "Item"

    def page_of(self, queryset: Any) -> Page:
        """One page of `queryset` (newest first) by the request's `limit` and `cursor`."""
        limit, cursor = paging_params(self.request)
        return keyset_page(queryset, self.request, limit=limit, cursor=cursor)

    def page_response(self, page: Page, represent: Callable[[Any], dict[str, Any]]) -> Response:
        """The page's wire shape: `{results, next, previous}`."""
        return Response(
            {"results": [represent(item) for item in page.items], "next": page.next, "previous": page.previous}
        )

    def item_id(self, raw: str, item_name: str | None = None) -> uuid.UUID:
        """The UUID in a path; 404 naming the item (`item_name`, or the view's) when it is none."""
        try:
            return uuid.UUID(raw)
        except ValueError:
            raise NotFound(f"{item_name or self.item_name} {raw} not found.") from None
