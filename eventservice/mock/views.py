"""The built-in mock target: a harmless HTTP peer to try calls against offline (docs/commands.md).

No authentication, any method, no CSRF. Every route takes `?status=<code>` and `?delay=<ms>`,
so `/mock/echo?status=201&delay=200` answers 201 after 200 ms. It shares the web server with the
product, so its work is bounded (docs/security.md#6-deployment-hardening): delays are capped at
MAX_DELAY_MS, at most MOCK_DELAY_CONCURRENCY delayed answers wait at once per process (more get
503 at once), at most MAX_BODY_BYTES of a request body is read, and MOCK_TARGET_ENABLED=false
turns it all off (404).
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core.secrets import redact_headers

MAX_DELAY_MS = 10_000
MAX_BODY_BYTES = 64 * 1024
# Statuses whose responses carry no body (RFC 9110 §6.4.1).
_NO_BODY = {204, 205, 304}

ROUTES = {
    "/mock/": "This index.",
    "/mock/echo": "Echoes method, path, query, headers (secrets redacted) and body as JSON.",
    "/mock/echo/<anything>": "Same as /mock/echo, for any path below it.",
    "/mock/status/<code>": "Answers with that status (100-599) and a small JSON body.",
    "/mock/delay/<ms>": f"Waits <ms> milliseconds (at most {MAX_DELAY_MS}), then answers 200.",
    "/mock/json": "A fixed JSON document.",
}
QUERY_OPTIONS = {
    "status": "Answer with this status (100-599) instead of the route's own.",
    "delay": f"Wait this many milliseconds first (0-{MAX_DELAY_MS}).",
}

FIXED_DOCUMENT = {
    "service": "mock-target",
    "order": {
        "id": 1042,
        "customer": {"name": "Ada Lovelace", "email": "ada@example.com"},
        "items": [
            {"sku": "BOOK-1", "title": "Notes on the Analytical Engine", "quantity": 1, "price": 42.0},
            {"sku": "PEN-7", "title": "Fountain pen", "quantity": 2, "price": 7.5},
        ],
        "total": 57.0,
        "currency": "EUR",
        "paid": True,
    },
}


class _BadQuery(ValueError):
    pass


_slots_lock = threading.Lock()
_slots: dict[int, threading.BoundedSemaphore] = {}


def _delay_slots() -> threading.BoundedSemaphore:
    """This process's slots for delayed answers (one semaphore per configured size)."""
    size = settings.MOCK_DELAY_CONCURRENCY
    with _slots_lock:
        return _slots.setdefault(size, threading.BoundedSemaphore(size))


def _mock_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Any method without a CSRF token; 404 when the mock target is turned off."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.MOCK_TARGET_ENABLED:
            return JsonResponse({"error": "The mock target is turned off here."}, status=404)
        return view(request, *args, **kwargs)

    return wrapper


def _quiet(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"
    # A chosen 4xx/5xx (or a busy 503) is the mock doing its job, not a server error: keep it
    # out of django.request's error log.
    response._has_been_logged = True
    return response


def _int_param(request: HttpRequest, name: str, low: int, high: int) -> int | None:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise _BadQuery(f"{name} must be an integer from {low} to {high}.") from None
    if not low <= value <= high:
        raise _BadQuery(f"{name} must be an integer from {low} to {high}.")
    return value


def _respond(request: HttpRequest, payload: dict[str, Any], *, status: int = 200, delay_ms: int = 0) -> HttpResponse:
    """Apply the `status` and `delay` query options, then answer."""
    try:
        status = _int_param(request, "status", 100, 599) or status
        delay_ms = max(delay_ms, _int_param(request, "delay", 0, MAX_DELAY_MS) or 0)
    except _BadQuery as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    if delay_ms:
        delay_ms = min(delay_ms, MAX_DELAY_MS)
        slots = _delay_slots()
        # Never wait for a slot: a queue of sleepers would hold web threads just the same.
        if not slots.acquire(blocking=False):
            busy = JsonResponse(
                {"error": "The mock target is busy with other delayed answers; try again later."}, status=503
            )
            busy["Retry-After"] = str(math.ceil(MAX_DELAY_MS / 1000))
            return _quiet(busy)
        try:
            time.sleep(delay_ms / 1000)
        finally:
            slots.release()
        payload = {**payload, "delayedMs": delay_ms}
    if status in _NO_BODY or status < 200:
        response = HttpResponse(status=status)
    else:
        response = HttpResponse(json.dumps(payload), status=status, content_type="application/json")
    return _quiet(response)


def _read_body(request: HttpRequest) -> tuple[bytes, bool]:
    """At most MAX_BODY_BYTES of the body, and whether there was more."""
    data = request.read(MAX_BODY_BYTES + 1)
    return data[:MAX_BODY_BYTES], len(data) > MAX_BODY_BYTES


@_mock_view
def index(request: HttpRequest) -> HttpResponse:
    return _respond(request, {"service": "mock-target", "routes": ROUTES, "queryOptions": QUERY_OPTIONS})


@_mock_view
def echo(request: HttpRequest, rest: str = "") -> HttpResponse:
    raw, truncated = _read_body(request)
    text = raw.decode("utf-8", "replace")
    parsed: Any = None
    if raw and not truncated:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
    payload = {
        "method": request.method,
        "path": request.path,
        "query": {key: request.GET.getlist(key) for key in request.GET},
        "headers": redact_headers(dict(request.headers)),
        "body": text,
        "bodyTruncated": truncated,
        "json": parsed,
    }
    return _respond(request, payload)


@_mock_view
def status(request: HttpRequest, code: int) -> HttpResponse:
    if not 100 <= code <= 599:
        return JsonResponse({"error": "The status must be from 100 to 599."}, status=400)
    return _respond(request, {"status": code}, status=code)


@_mock_view
def delay(request: HttpRequest, ms: int) -> HttpResponse:
    return _respond(request, {"requestedMs": ms}, delay_ms=min(ms, MAX_DELAY_MS))


@_mock_view
def fixed_json(request: HttpRequest) -> HttpResponse:
    return _respond(request, FIXED_DOCUMENT)
