"""Reads only the pages need: recent failures, and which tenant owns a shared link's call.

Every read that touches tenant data takes the tenant ids the viewer may see (None: all, for
superusers).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from django.db.models import QuerySet

from orchestration.models import ServiceCall


def _scoped(qs: QuerySet, tenant_ids: Collection[str] | None, field: str = "tenant_id") -> QuerySet:
    return qs if tenant_ids is None else qs.filter(**{f"{field}__in": list(tenant_ids)})


def recent_failed_calls(*, tenant_ids: Collection[str] | None, limit: int = 20) -> list[ServiceCall]:
    # Newest submitted first: ids are time-ordered, so this walks service_calls_tenant_status.
    qs = ServiceCall.objects.filter(status=ServiceCall.Status.FAILED).order_by("-service_call_id")
    return list(_scoped(qs, tenant_ids)[:limit])


def call_tenant_id(*, service_call_id: uuid.UUID, tenant_ids: Collection[str]) -> str | None:
    """Which of these tenants owns the call (a shared link may point into another of them)."""
    return (
        ServiceCall.objects.filter(pk=service_call_id, tenant_id__in=list(tenant_ids))
        .values_list("tenant_id", flat=True)
        .first()
    )
