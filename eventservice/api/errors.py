"""One exception handler: every API error becomes RFC 7807 `application/problem+json`.

Body: `{type, title, status, detail, correlationId}` and, for invalid input,
`errors: {field: [messages]}` with the wire field names. Any other path under /api/ is such a
404 too (ApiNotFound).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView, set_rollback

from core.db import is_pool_timeout
from core.errors import ApplicationError, NotFound
from eventservice.middleware import DATABASE_BUSY_RETRY_AFTER

logger = logging.getLogger("eventservice.api")

PROBLEM_CONTENT_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:service-agent:problem:"

# DRF exception class -> (type slug, title); the most specific class first.
_DRF_PROBLEMS: list[tuple[type[exceptions.APIException], str, str]] = [
    (exceptions.ParseError, "malformed-request", "Malformed request body"),
    (exceptions.ValidationError, "validation-error", "Invalid input"),
    (exceptions.NotAuthenticated, "not-authenticated", "Authentication required"),
    (exceptions.AuthenticationFailed, "authentication-failed", "Authentication failed"),
    (exceptions.PermissionDenied, "forbidden", "Forbidden"),
    (exceptions.NotFound, "not-found", "Not found"),
    (exceptions.MethodNotAllowed, "method-not-allowed", "Method not allowed"),
    (exceptions.NotAcceptable, "not-acceptable", "Not acceptable"),
    (exceptions.UnsupportedMediaType, "unsupported-media-type", "Unsupported media type"),
    (exceptions.Throttled, "throttled", "Too many requests"),
]


def problem_body(
    *,
    slug: str,
    title: str,
    status_code: int,
    detail: str,
    correlation_id: str | None,
    errors: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": TYPE_PREFIX + slug,
        "title": title,
        "status": status_code,
        "detail": detail,
        "correlationId": correlation_id,
    }
    if errors:
        body["errors"] = errors
    return body


def problem_response(
    *,
    slug: str,
    title: str,
    status_code: int,
    detail: str,
    request: Any = None,
    errors: dict[str, list[str]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    correlation_id = getattr(request, "correlation_id", None) if request is not None else None
    body = problem_body(
        slug=slug,
        title=title,
        status_code=status_code,
        detail=detail,
        correlation_id=correlation_id,
        errors=errors,
    )
    return Response(body, status=status_code, headers=headers, content_type=PROBLEM_CONTENT_TYPE)


def _drf_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Flatten DRF's nested error detail into {field: [messages]} with dotted names."""
    if isinstance(detail, dict):
        flat: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = "body" if key == "non_field_errors" else (f"{prefix}.{key}" if prefix else str(key))
            for field, messages in _drf_errors(value, name).items():
                flat.setdefault(field, []).extend(messages)
        return flat
    if isinstance(detail, list):
        flat = {}
        for item in detail:
            for field, messages in _drf_errors(item, prefix).items():
                flat.setdefault(field, []).extend(messages)
        return flat
    return {prefix or "body": [str(detail)]}


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    request = context.get("request")
    set_rollback()

    if isinstance(exc, ApplicationError):
        return problem_response(
            slug=exc.type_slug,
            title=exc.title,
            status_code=exc.status,
            detail=exc.detail,
            request=request,
            errors=exc.errors or None,
        )
    if isinstance(exc, RequestDataTooBig):
        return problem_response(
            slug="payload-too-large",
            title="Payload too large",
            status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            detail="The request body is larger than the server accepts.",
            request=request,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, SuspiciousOperation):
        exc = exceptions.ParseError("The request was refused as malformed.")

    if isinstance(exc, exceptions.APIException):
        slug, title = next(
            ((slug, title) for cls, slug, title in _DRF_PROBLEMS if isinstance(exc, cls)),
            ("error", "Error"),
        )
        headers: dict[str, str] = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            # Whole seconds, rounded up: a wait under a second is still worth waiting for.
            headers["Retry-After"] = str(max(1, math.ceil(exc.wait)))
        errors = None
        if isinstance(exc, exceptions.ValidationError):
            errors = _drf_errors(exc.detail)
            detail = next(
                (f"{field}: {messages[0]}" for field, messages in errors.items() if messages), "Invalid input"
            )
        elif isinstance(exc.detail, str):
            detail = str(exc.detail)
        else:
            detail = title
        if (
            isinstance(exc, exceptions.NotAuthenticated)
            and request is not None
            and request.headers.get("Authorization")
        ):
            # An Authorization header none of the authentications reads (not Bearer).
            detail += ' The API takes "Authorization: Bearer <api key>" (an API key of the tenant: docs/api.md).'

        return problem_response(
            slug=slug,
            title=title,
            status_code=exc.status_code,
            detail=detail,
            request=request,
            errors=errors,
            headers=headers,
        )

    if is_pool_timeout(exc):
        # Every connection of this process's pool stayed busy for DB_POOL_TIMEOUT_SECONDS: a
        # burst, not a bug (docs/deploy.md, "Connections").
        logger.warning("no database connection came free in time: answered 503", extra={"path": request.path})
        busy = problem_response(
            slug="database-busy",
            title="Service unavailable",
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            detail="The server has no database connection free just now; try again in a moment.",
            request=request,
            headers={"Retry-After": str(DATABASE_BUSY_RETRY_AFTER)},
        )
        busy._has_been_logged = True  # the warning above says it, once
        return busy

    # Anything else is our bug: log it with the request's context, reveal nothing.
    logger.exception(
        "unhandled error in API view",
        extra={
            "path": getattr(request, "path", ""),
            "method": getattr(request, "method", ""),
        },
    )
    return problem_response(
        slug="internal-error",
        title="Internal server error",
        status_code=500,
        detail="An unexpected error occurred; quote the correlation id when reporting it.",
        request=request,
    )


class ApiNotFound(APIView):
    """Any other path under /api/: a problem+json 404 rather than an HTML page."""

    authentication_classes: list = []
    permission_classes: list = []
    schema = None  # not part of the OpenAPI document

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        raise NotFound("There is no API resource at this path.")
