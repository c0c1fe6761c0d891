"""The outcome of an attempt: the contract between execution and orchestration."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import models


class ErrorKind(models.TextChoices):
    HTTP_ERROR = "HttpError"
    TIMEOUT = "Timeout"
    NETWORK_ERROR = "NetworkError"
    TLS_ERROR = "TlsError"
    EGRESS_DENIED = "EgressDenied"
    INTERRUPTED = "Interrupted"
    INTERNAL_ERROR = "InternalError"
    # The call's connection gave no credentials: its OAuth2 token endpoint failed or refused, or
    # the connection is gone (docs/connections.md). Nothing was sent to the target.
    CREDENTIAL_ERROR = "CredentialError"


@dataclass(frozen=True)
class Outcome:
    """What one attempt produced: a response (2xx) or a typed error."""

    succeeded: bool
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body_snippet: str | None = None
    body_truncated: bool = False
    latency_ms: int | None = None
    error_kind: str | None = None
    error_message: str | None = None
    # The tries before this one within the attempt (an OAuth2 target's 401 before the token was
    # fetched again: execution/credentials.py), for the attempt log.
    earlier_tries: tuple[dict[str, Any], ...] = ()
    # When the attempt's request set out (its thread's clock, after any wait for its start): the
    # attempt's startedAt once recorded. None for an outcome no request was sent for.
    started_at: datetime | None = None

    @classmethod
    def failure(cls, kind: str, message: str, *, status: int | None = None, latency_ms: int | None = None) -> Outcome:
        return cls(
            succeeded=False,
            error_kind=kind,
            error_message=message[:2000],
            status=status,
            latency_ms=latency_ms,
        )

    def as_meta(self) -> dict[str, Any]:
        """The camelCase `outcome` of the wire format (docs/api.md, 'Outcome')."""
        if self.succeeded:
            return {
                "responseMeta": {
                    "status": self.status,
                    "headers": self.headers,
                    "bodySnippet": self.body_snippet,
                    "bodyTruncated": self.body_truncated,
                    "latencyMs": self.latency_ms,
                }
            }
        error: dict[str, Any] = {"kind": self.error_kind, "message": self.error_message}
        if self.status is not None:
            error["status"] = self.status
        if self.latency_ms is not None:
            error["latencyMs"] = self.latency_ms
        if self.headers or self.body_snippet:
            error["headers"] = self.headers
            error["bodySnippet"] = self.body_snippet
            error["bodyTruncated"] = self.body_truncated
        return {"errorMeta": error}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Outcome:
        if "responseMeta" in meta:
            r = meta["responseMeta"]
            return cls(
                succeeded=True,
                status=r.get("status"),
                headers=r.get("headers") or {},
                body_snippet=r.get("bodySnippet"),
                body_truncated=bool(r.get("bodyTruncated")),
                latency_ms=r.get("latencyMs"),
            )
        e = meta["errorMeta"]
        return cls(
            succeeded=False,
            error_kind=e.get("kind"),
            error_message=e.get("message"),
            status=e.get("status"),
            latency_ms=e.get("latencyMs"),
            headers=e.get("headers") or {},
            body_snippet=e.get("bodySnippet"),
            body_truncated=bool(e.get("bodyTruncated")),
        )
