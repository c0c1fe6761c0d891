"""Showing stored values that the rules of docs/security.md §1 would refuse today.

A row written before those rules (or by hand) may hold text with lone UTF-16 surrogates (JSON
columns keep them as `\\udXXX` escapes and decoding brings them back; no UTF-8 encoder takes
them) or a value nested hundreds of levels deep (Python's JSON encoder recurses once per
level). One such row must not make every page holding it a 500: the API's renderer, the
template engine and the JSON shown on pages go through these helpers, so no view needs a
special case.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import JsonResponse
from django.template.backends import django as django_backend
from django.utils.safestring import SafeData, mark_safe

LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# How deep a value is shown when it is too deep to encode whole: deeper than anything the
# validation lets in (docs/security.md §1), shallow enough for any encoder.
RENDER_DEPTH = 100
CLIPPED = "[…nested too deep to show]"


def without_lone_surrogates(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD, as a UTF-8 decoder shows bad bytes."""
    if LONE_SURROGATE.search(text) is None:
        return text
    return LONE_SURROGATE.sub("\ufffd", text)


def clipped(value: Any, max_depth: int = RENDER_DEPTH) -> Any:
    """A copy of a JSON value with whatever nests deeper than `max_depth` replaced by CLIPPED.

    Iterative: the value may be too deep for anything recursive, which is why it is clipped.
    """
    holder: list[Any] = [None]
    pending: list[tuple[Any, Any, Any, int]] = [(value, holder, 0, 0)]
    while pending:
        item, parent, key, depth = pending.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                parent[key] = CLIPPED
                continue
            if isinstance(item, dict):
                copy: Any = dict.fromkeys(item)
                pending.extend((child, copy, child_key, depth + 1) for child_key, child in item.items())
            else:
                copy = [None] * len(item)
                pending.extend((child, copy, index, depth + 1) for index, child in enumerate(item))
            parent[key] = copy
        else:
            parent[key] = item
    return holder[0]


def display_json(value: Any, *, indent: int = 2) -> str:
    """JSON for people on a page (non-ASCII as it is); a value too deep to encode is clipped."""
    try:
        return json.dumps(value, indent=indent, ensure_ascii=False)
    except RecursionError:
        return json.dumps(clipped(value), indent=indent, ensure_ascii=False)


def json_response(data: Any, **kwargs: Any) -> JsonResponse:
    """Django's JsonResponse (ASCII, so lone surrogates come out escaped); a value too deep to
    encode is clipped, as the API's renderer does."""
    try:
        return JsonResponse(data, **kwargs)
    except RecursionError:
        return JsonResponse(clipped(data), **kwargs)


class DjangoTemplates(django_backend.DjangoTemplates):
    """Django's template engine (settings.TEMPLATES), whose pages never hold a lone surrogate:
    Django encodes a response as strict UTF-8, so one would make the page a 500."""

    def from_string(self, template_code: str) -> _Template:
        return _Template(super().from_string(template_code).template, self)

    def get_template(self, template_name: str) -> _Template:
        return _Template(super().get_template(template_name).template, self)


class _Template(django_backend.Template):
    def render(self, context: Any = None, request: Any = None) -> str:
        page = super().render(context, request)
        cleaned = without_lone_surrogates(page)
        if cleaned is page:
            return page
        # The same markup with other characters: as safe as it was.
        return mark_safe(cleaned) if isinstance(page, SafeData) else cleaned
