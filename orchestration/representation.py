"""The wire representation of a service call: one builder for the API and the dashboard. The
call with its events' deliveries combines two domains and is the edge's
(eventservice.representation).

camelCase keys, times as ISO 8601 UTC with milliseconds and Z, secret header values
redacted (docs/api.md, 'Wire format'; docs/security.md, '4. Secrets').
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.conf import settings
from django.urls import get_script_prefix, get_urlconf, reverse

from core.ids import iso_ms
from core.secrets import redact_headers
from execution.models import HttpExecution
from orchestration.admission import held_ms_of
from orchestration.models import FAVORITE_TAG, ServiceCall
from orchestration.selectors import tags_of
from orchestration.services import public_request_spec
from outbox.models import OutboxEvent


def _url(request: Any, path: str, base_url: str | None = None) -> str:
    if request is not None:
        return request.build_absolute_uri(path)
    return base_url.rstrip("/") + path if base_url else path


def service_call_links(call: ServiceCall, *, request: Any = None, base_url: str | None = None) -> dict[str, str]:
    calls, events = _tenant_paths(get_script_prefix(), get_urlconf() or settings.ROOT_URLCONF, call.tenant_id)
    # The call's path and its sub-resources are fixed suffixes of the collection's (api/urls.py).
    path = f"{calls}/{call.service_call_id}"
    own = _url(request, path, base_url)
    # These paths are plain ASCII (a tenant slug, a UUID), so the absolute URL of each is the
    # call's with its path swapped: one build_absolute_uri (host checks, IRI quoting) for all.
    origin = own[: -len(path)] if own.endswith(path) else None
    links = {
        "self": own,
        "tags": f"{own}/tags",
        "rerun": f"{own}/rerun",
        "cancel": f"{own}/cancel",
        "events": origin + events if origin is not None else _url(request, events, base_url),
    }
    if call.rerun_of:
        rerun_of = f"{calls}/{call.rerun_of}"
        links["rerunOf"] = origin + rerun_of if origin is not None else _url(request, rerun_of, base_url)
    return links


@lru_cache(maxsize=1024)
def _tenant_paths(script_prefix: str, urlconf: Any, tenant_id: str) -> tuple[str, str]:
    """A tenant's service-calls and events paths. reverse() costs more than the rest of a
    call's representation, and these paths only change with the tenant (and the prefix the
    site is served under); a call id needs no quoting (hex digits and '-')."""
    return (
        reverse("api:service-calls", kwargs={"tenant_id": tenant_id}, urlconf=urlconf),
        reverse("api:tenant-events", kwargs={"tenant_id": tenant_id}, urlconf=urlconf),
    )


def outcome_representation(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """`{responseMeta}` or `{errorMeta}`; response headers redacted once more on the way out."""
    if not meta:
        return None
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if isinstance(value, dict) and "headers" in value:
            value = {**value, "headers": redact_headers(value.get("headers"))}
        out[key] = value
    return out


def service_call_representation(
    call: ServiceCall, *, tags: list[str] | None = None, request: Any = None, base_url: str | None = None
) -> dict[str, Any]:
    """The call as the API (list, detail, submit, tags, rerun) and the live pages show it.

    `tags` defaults to the call's prefetched tag rows (selectors.service_calls_for_tenant).
    With a request, links are absolute URLs built from it; without one, from `base_url` (the
    agent's address, for a command: AGENT_BASE_URL); with neither, absolute paths.
    """
    tag_list = list(tags) if tags is not None else tags_of(call)
    return {
        "serviceCallId": str(call.service_call_id),
        "tenantId": call.tenant_id,
        "name": call.name,
        "status": call.status,
        "submittedAt": iso_ms(call.submitted_at),
        "dueAt": iso_ms(call.due_at),
        "startedAt": iso_ms(call.started_at),
        "finishedAt": iso_ms(call.finished_at),
        "requestSpec": public_request_spec(call.request_spec),
        "tags": tag_list,
        "favorite": FAVORITE_TAG in tag_list,
        # Only a finished call has an outcome; a cancelled one may hold its last attempt's error.
        "outcome": outcome_representation(call.outcome_meta) if call.status in FINISHED else None,
        "attempt": call.attempts,
        "retryPolicy": call.retry_policy,
        "nextAttemptAt": iso_ms(call.due_at) if call.status == ServiceCall.Status.SCHEDULED and call.attempts else None,
        "lastError": _last_error(call),
        "scheduleId": str(call.schedule_id) if call.schedule_id else None,
        "occurrenceAt": iso_ms(call.occurrence_at),
        "overlap": call.overlap or None,
        "overlapState": call.overlap_state or None,
        # Flow control (docs/flow-control.md): how long it waited for room, the wait in progress included.
        "heldSince": iso_ms(call.held_since),
        "heldMs": held_ms_of(call),
        "correlationId": call.correlation_id,
        "links": service_call_links(call, request=request, base_url=base_url),
    }


FINISHED = (ServiceCall.Status.SUCCEEDED, ServiceCall.Status.FAILED)


def _last_error(call: ServiceCall) -> dict[str, Any] | None:
    """The failed attempt a retry follows (while the call waits for, or makes, its next one, or
    after it was cancelled while waiting)."""
    if call.status in FINISHED or not call.outcome_meta:
        return None
    return (outcome_representation(call.outcome_meta) or {}).get("errorMeta")


def execution_representation(row: HttpExecution) -> dict[str, Any]:
    """One attempt of the attempt log (http_execution_log), camelCase, headers redacted."""
    response = None
    if row.response_status is not None:
        response = {
            "status": row.response_status,
            "headers": redact_headers(row.response_headers),
            "bodySnippet": row.response_body,
            "bodyTruncated": row.response_body_truncated,
        }
    error = None
    if row.error_kind:
        error = {"kind": row.error_kind, "message": row.error_message}
    return {
        "executionId": str(row.execution_id),
        "attempt": row.attempt,
        "state": row.state,
        "startedAt": iso_ms(row.started_at),
        "finishedAt": iso_ms(row.finished_at),
        "request": {
            "method": row.request_method,
            "url": row.request_url,
            "headers": redact_headers(row.request_headers),
            "bodySnippet": row.request_body,
            "timeoutMs": row.timeout_ms,
        },
        "response": response,
        "latencyMs": row.latency_ms,
        "error": error,
        # With a connection: its name, and the tries before this one (a 401 that fetched the
        # OAuth2 token again: docs/connections.md).
        **({"connection": row.connection_name} if row.connection_name else {}),
        **({"earlierTries": row.earlier_tries} if row.earlier_tries else {}),
    }


def event_representation(row: OutboxEvent) -> dict[str, Any]:
    """An outbox event: its envelope, its sequence and its publication time.

    The envelope's fields: docs/schema.md, 'The event envelope'.
    """
    return {
        **row.event_payload,
        "sequence": row.id,
        "publishedAt": iso_ms(row.published_at),
    }
