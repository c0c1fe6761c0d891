"""Correlation ids (echo a valid incoming X-Correlation-Id or mint one; bind it to logs), the
503 of a request that found no database connection free, and the Content-Security-Policy header."""

from __future__ import annotations

import http.client
import logging
import re
from dataclasses import asdict
from typing import Any

from csp.constants import HEADER as CSP_HEADER
from csp.constants import HEADER_REPORT_ONLY as CSP_HEADER_REPORT_ONLY
from csp.constants import UNSAFE_INLINE
from csp.middleware import CheckableLazyObject, CSPMiddleware, PolicyParts
from csp.utils import build_policy
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpResponse

from core.db import is_pool_timeout
from core.ids import new_id
from core.logging import log_context

logger = logging.getLogger("eventservice.request")

HEADER = "X-Correlation-Id"
# Seconds a client is asked to wait when no database connection came free in time.
DATABASE_BUSY_RETRY_AFTER = 1
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


class DatabaseBusyMiddleware:
    """A page whose request found no database connection free within DB_POOL_TIMEOUT_SECONDS
    answers 503 with `Retry-After`, not 500: the pool was busy, nothing is broken (the API's own
    answer: eventservice/api/errors.py; docs/deploy.md, "Connections")."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not is_pool_timeout(exception):
            return None
        logger.warning("no database connection came free in time: answered 503", extra={"path": request.path})
        response = HttpResponse(
            "The server has no database connection free just now; try again in a moment.\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = str(DATABASE_BUSY_RETRY_AFTER)
        response._has_been_logged = True  # the warning above says it, once
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

    def process_response(self, request, response):
        """A response that asked for nothing of its own (no nonce, no decorator's policy, not
        an admin page: every API answer) gets the settings' policy, built once per process
        rather than twice per response (enforced and report-only; about 5 % of a POST's
        instructions, bench/HISTORY.md, 'Before and after: fewer index writes, NATS acks on an
        inbox, one CSP build'). Any other goes through django-csp as it is."""
        if not _plain(request, response):
            return super().process_response(request, response)
        for name, value in _settings_policy():
            if value and name not in response:
                response[name] = value
        # As django-csp does: a nonce asked for after the header went out is an error.
        request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)
        return response


# What a response or a view may set to change its policy (django-csp's decorators).
_PER_RESPONSE = frozenset(
    f"_csp_{what}{suffix}" for what in ("config", "update", "replace", "exempt") for suffix in ("", "_ro")
)
# The settings' policy headers, ((name, value), ...): replaced whole, never changed in place,
# so a thread reading it meanwhile reads the old one or the new one.
_settings_headers: tuple[tuple[str, str], ...] | None = None


def _plain(request: Any, response: Any) -> bool:
    if settings.DEBUG and response.status_code in (http.client.INTERNAL_SERVER_ERROR, http.client.NOT_FOUND):
        return False  # django-csp leaves Django's debug pages alone
    if getattr(request, "_csp_nonce", None) is not None:
        return False
    if any(hasattr(response, name) for name in _PER_RESPONSE):  # set on the response or its class
        return False
    if request.path_info.startswith(ContentSecurityPolicyMiddleware.ADMIN_PREFIX):
        return False
    return not any(
        (getattr(settings, name, None) or {}).get("EXCLUDE_URL_PREFIXES")
        for name in ("CONTENT_SECURITY_POLICY", "CONTENT_SECURITY_POLICY_REPORT_ONLY")
    )


def _settings_policy() -> tuple[tuple[str, str], ...]:
    """The headers of the settings' policies, as django-csp builds them for a response that
    asks for nothing of its own; built once, again after a change of the settings (tests)."""
    global _settings_headers
    headers = _settings_headers
    if headers is None:
        parts = asdict(PolicyParts())
        headers = _settings_headers = (
            (CSP_HEADER, build_policy(**parts)),
            (CSP_HEADER_REPORT_ONLY, build_policy(**parts, report_only=True)),
        )
    return headers


@receiver(setting_changed)
def _forget_settings_policy(*, setting: str, **kwargs: Any) -> None:
    global _settings_headers
    if setting.startswith("CONTENT_SECURITY_POLICY"):
        _settings_headers = None
