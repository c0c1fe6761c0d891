"""Recurring schedules from a test, made through the schedules module's own validation and
services (tests/support/factories.py holds the other domain objects)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from orchestration.models import ServiceCall
from schedules.models import Schedule
from schedules.services import schedule_create
from schedules.validation import validate_schedule
from tests.support.factories import NEVER_CALLED


def schedules_url(tenant: str = "acme", suffix: str = "") -> str:
    return f"/api/tenants/{tenant}/schedules{suffix}"


def schedule_url(schedule_id: Any, tenant: str = "acme", suffix: str = "") -> str:
    return f"{schedules_url(tenant)}/{schedule_id}{suffix}"


def schedule_payload(**overrides: Any) -> dict[str, Any]:
    """A valid create body in the wire shape; `spec` updates the requestSpec."""
    payload: dict[str, Any] = {
        "name": "Nightly export",
        "cron": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "requestSpec": {"method": "POST", "url": NEVER_CALLED, "headers": {"X-Job": "export"}},
        "tags": ["nightly"],
    }
    for key, value in overrides.items():
        if key == "spec":
            payload["requestSpec"].update(value)
        else:
            payload[key] = value
    return copy.deepcopy(payload)


def make_schedule(
    tenant_id: str = "acme",
    *,
    name: str = "schedule",
    cron: str = "30 2 * * *",
    timezone: str | None = None,
    url: str = NEVER_CALLED,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    tags: Iterable[str] = (),
    retry_policy: dict[str, Any] | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    paused: bool | None = None,
    now: datetime | None = None,
    connection: str | None = None,
    overlap: str | None = None,
) -> Schedule:
    """A schedule stored as every edge stores one (validation, then schedule_create), its first
    call made ahead unless paused. `now` is the clock the service plans from."""
    spec: dict[str, Any] = {"method": method, "url": url}
    if headers is not None:
        spec["headers"] = headers
    if connection is not None:
        spec["connection"] = connection
    data: dict[str, Any] = {"name": name, "cron": cron, "requestSpec": spec, "tags": list(tags)}
    if timezone is not None:
        data["timezone"] = timezone
    if retry_policy is not None:
        data["retryPolicy"] = retry_policy
    if start_at is not None:
        data["startAt"] = start_at.isoformat()
    if end_at is not None:
        data["endAt"] = end_at.isoformat()
    if paused is not None:
        data["paused"] = paused
    if overlap is not None:
        data["overlap"] = overlap
    return schedule_create(tenant_id=tenant_id, data=validate_schedule(data, now=now), now=now)


def calls_of(schedule: Schedule) -> list[ServiceCall]:
    """The schedule's calls, oldest occurrence first, re-read from the database."""
    return list(ServiceCall.objects.filter(schedule_id=schedule.schedule_id).order_by("occurrence_at"))


def occurrences_made(schedule: Schedule) -> list[datetime]:
    return [call.occurrence_at for call in calls_of(schedule)]
