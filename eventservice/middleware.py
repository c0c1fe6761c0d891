"""Correlation ids: echo a valid incoming X-Correlation-Id or mint one; bind it to logs."""

from __future__ import annotations

import re

from eventservice.ids import new_id
from eventservice.logging import log_context

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
