"""A call's outcome in a few words, for a row of the status page and its live updates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestration.models import ServiceCall


@dataclass(frozen=True)
class OutcomeSummary:
    label: str  # "200", "HttpError 503", "Timeout"
    ok: bool
    latency_ms: float | None
    # The call is not Failed (a retry waits, or it was cancelled meanwhile): this was its last attempt.
    last_attempt: bool = False


def _number(value: Any) -> float | None:
    # KT() reads JSON as text on PostgreSQL and as a number on SQLite.
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def outcome_summary(call: ServiceCall) -> OutcomeSummary | None:
    """From the annotations of selectors.call_list_rows; None when there is no outcome yet."""
    status = _number(getattr(call, "outcome_status", None))
    kind = getattr(call, "outcome_kind", None)
    latency = _number(getattr(call, "outcome_latency_ms", None))
    code = str(int(status)) if status is not None else ""
    if call.status == ServiceCall.Status.SUCCEEDED:
        return OutcomeSummary(label=code or "OK", ok=True, latency_ms=latency)
    if not kind:
        return None
    label = f"{kind} {code}" if code else str(kind)
    # Not Failed yet (a retry waits) or no longer (cancelled while waiting): the last attempt's.
    return OutcomeSummary(
        label=label, ok=False, latency_ms=latency, last_attempt=call.status != ServiceCall.Status.FAILED
    )
