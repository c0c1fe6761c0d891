"""Reads of the attempt log."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime

from django.db.models import QuerySet

from execution.models import HttpExecution


def attempts_for_call(*, tenant_id: str, service_call_id: uuid.UUID | str) -> QuerySet[HttpExecution]:
    return HttpExecution.objects.filter(tenant_id=tenant_id, service_call_id=service_call_id).order_by("attempt")


def attempts_sending(*, started_before: datetime | None = None, limit: int = 500) -> list[HttpExecution]:
    """Attempts whose request may be on the wire (uses http_execution_log_sending)."""
    qs = HttpExecution.objects.filter(state=HttpExecution.State.SENDING)
    if started_before is not None:
        qs = qs.filter(started_at__lt=started_before)
    return list(qs.order_by("started_at")[:limit])


def attempts_by_call(*, attempts: Iterable[tuple[uuid.UUID, int]]) -> dict[uuid.UUID, HttpExecution]:
    """The attempt row of each (call, attempt number) that has one, by call id."""
    wanted = dict(attempts)
    rows = HttpExecution.objects.filter(service_call_id__in=list(wanted), attempt__in=set(wanted.values()))
    return {row.service_call_id: row for row in rows if wanted[row.service_call_id] == row.attempt}
