"""Correlation ids (echo a valid incoming X-Correlation-Id or mint one; bind it to logs) and
the Content-Security-Policy header."""

from __future__ import annotations

import re

from csp.constants import UNSAFE_INLINE
from csp.middleware import CSPMiddleware, PolicyParts

from core.ids import new_id
from core.logging import log_context

HEADER = "X-Correlation-Id"
_VALID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def valid_correlation_id(value: str | None) -> bool:
    return bool(value) and bool(_VALID.match(value))


class CorrelationIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        incoming = request.headers.get(HEADER)
        correlation_id = incoming if valid_correlation_id(incoming) else str(new_id())
        request.correlation_id = correlation_id
        with log_context(correlationId=correlation_id):
            response = self.get_response(request)
        response[HEADER] = correlation_id
        return response


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's middleware with one narrow exception: style attributes on admin pages.

    Some of the product's admin columns colour a status or wrap JSON with `style="..."`
    (orchestration/, outbox/, workers/ admin.py). An inline style attribute cannot run script,
    and the policy's img-src still keeps any url() in it on this origin, so the admin alone gets
    `style-src-attr 'unsafe-inline'`; the dashboard and the API docs stay strict
    (docs/security.md#6-deployment-hardening). Once those columns use classes, drop this.
    """

    ADMIN_PREFIX = "/admin/"

    def get_policy_parts(self, request, response, report_only: bool = False) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if not report_only and request.path_info.startswith(self.ADMIN_PREFIX):
            parts.update = {**(parts.update or {}), "style-src-attr": [UNSAFE_INLINE]}
        return parts
