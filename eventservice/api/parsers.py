"""The API's JSON parser: DRF's, with the nesting limit of docs/security.md §1.

Python's JSON decoder recurses once per level: a document nested about a thousand levels
deep raises RecursionError, which would surface as a 500, and anything shallower but absurd
would reach code that recurses the same way (repr, the encoder, the database's JSON column).
Both are refused here as a 400 naming `body`; the submission's own fields then get their
precise limits (MAX_BODY_DEPTH) from orchestration.validation.
"""

from __future__ import annotations

from typing import Any

from rest_framework import parsers

from core.errors import ValidationFailed
from orchestration.validation import MAX_DOCUMENT_DEPTH, nested_deeper_than


def _too_deep() -> ValidationFailed:
    return ValidationFailed({"body": [f"The request document is nested deeper than {MAX_DOCUMENT_DEPTH} levels."]})


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            # Deeper than the decoder can go (it unwinds cleanly): the same refusal.
            raise _too_deep() from None
        if nested_deeper_than(data, MAX_DOCUMENT_DEPTH):
            raise _too_deep()
        return data
