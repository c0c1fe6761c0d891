"""The one application error hierarchy; the API turns it into problem+json."""

from __future__ import annotations


class ApplicationError(Exception):
    status = 400
    title = "Bad request"
    type_slug = "bad-request"

    def __init__(self, detail: str = "", *, errors: dict[str, list[str]] | None = None):
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.errors = errors or {}


class ValidationFailed(ApplicationError):
    status = 400
    title = "Invalid input"
    type_slug = "validation-error"

    def __init__(self, errors: dict[str, list[str]], detail: str = ""):
        first = next(iter(errors.items()), ("", [""]))
        super().__init__(detail or f"{first[0]}: {first[1][0]}" if first[0] else "Invalid input", errors=errors)


class NotFound(ApplicationError):
    status = 404
    title = "Not found"
    type_slug = "not-found"


class Conflict(ApplicationError):
    status = 409
    title = "Conflict"
    type_slug = "conflict"
