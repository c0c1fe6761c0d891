"""The timeline of a call for its details page: submitted → scheduled → due → started → finished."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from execution.models import HttpExecution
from orchestration.admission import held_ms_of
from orchestration.models import ServiceCall
from outbox.models import OutboxEvent


@dataclass(frozen=True)
class Step:
    label: str
    at: datetime | None
    note: str = ""
    measure: timedelta | float | None = None  # a duration (timedelta) or milliseconds


def call_timeline(call: ServiceCall, events: Iterable[OutboxEvent], attempts: Iterable[HttpExecution]) -> list[Step]:
    scheduled_at = next((event.created_at for event in events if event.event_type == OutboxEvent.Type.SCHEDULED), None)
    due_gap = call.due_at - call.submitted_at
    steps = [
        Step("Submitted", call.submitted_at),
        Step("Scheduled", scheduled_at or call.submitted_at),
        Step(
            "Due",
            call.due_at,
            "at submission" if due_gap <= timedelta(0) else "after submission",
            due_gap if due_gap > timedelta(0) else None,
        ),
    ]
    steps.extend(_held(call))
    if call.started_at is not None:
        started = _set_out(call, attempts)
        steps.append(Step("Started", started, "lateness", started - call.due_at))
    else:
        steps.append(Step("Started", None, "not yet"))
    if call.finished_at is not None:
        latency = _latency_ms(call)
        steps.append(
            Step(
                "Finished",
                call.finished_at,
                "latency" if latency is not None else "",
                latency if latency is not None else None,
            )
        )
    else:
        steps.append(Step("Finished", None, "not yet"))
    return steps


def _set_out(call: ServiceCall, attempts: Iterable[HttpExecution]) -> datetime:
    """When the call's current attempt set out, once its outcome is recorded: the attempt log's
    startedAt is then the moment the request left, while a call started ahead has its due time
    as its own startedAt (docs/architecture.md, "Started ahead, sent on time")."""
    current = next((attempt for attempt in attempts if attempt.attempt == call.attempts), None)
    if current is not None and current.state == HttpExecution.State.FINISHED:
        return current.started_at
    return call.started_at


def _held(call: ServiceCall) -> list[Step]:
    """Flow control's wait (docs/flow-control.md): in progress, or done (its length, summed
    over the call's attempts; placed where it began when the call was held once)."""
    held = held_ms_of(call)
    if call.held_since is not None:
        return [
            Step("Held", call.held_since, "waiting for room under flow control, so far", timedelta(milliseconds=held))
        ]
    if not held:
        return []
    began = call.started_at - timedelta(milliseconds=held) if call.started_at and call.attempts <= 1 else None
    return [Step("Held", began, "held by flow control for", timedelta(milliseconds=held))]


def _latency_ms(call: ServiceCall) -> float | None:
    meta = call.outcome_meta or {}
    inner = meta.get("responseMeta") or meta.get("errorMeta") or {}
    if inner.get("latencyMs") is not None:
        return float(inner["latencyMs"])
    if call.started_at and call.finished_at:
        return (call.finished_at - call.started_at).total_seconds() * 1000
    return None
