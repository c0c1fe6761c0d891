"""The API's JSON renderer: DRF's, made unable to fail on a stored value (docs/security.md §1).

Validation refuses lone surrogates and deep nesting, but a row stored before those rules (or
written by hand) can still hold them, and one such row must not turn every list page and the
events feed holding it into a 500. Both fallbacks run only when the plain rendering fails.
"""

from __future__ import annotations

from typing import Any

from rest_framework import renderers

from core.rendering import clipped


class _AsciiJSONRenderer(renderers.JSONRenderer):
    ensure_ascii = True


_ASCII = _AsciiJSONRenderer()


class JSONRenderer(renderers.JSONRenderer):
    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        try:
            return self._render(data, accepted_media_type, renderer_context)
        except RecursionError:
            # Nested deeper than the encoder can go: shown clipped, with a marker where it was cut.
            return self._render(clipped(data), accepted_media_type, renderer_context)

    def _render(self, data: Any, accepted_media_type: str | None, renderer_context: Any) -> bytes:
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            # A lone surrogate has no UTF-8 form, but JSON can spell it as an escape: with every
            # non-ASCII character escaped the document is valid UTF-8 and says the same thing.
            return _ASCII.render(data, accepted_media_type, renderer_context)
