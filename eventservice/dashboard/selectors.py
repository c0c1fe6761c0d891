"""Reads only the pages need: the status page's rows, recent failures, and which tenant owns a
shared link's call.

Every read that touches tenant data takes the tenant ids the viewer may see (None: all, for
superusers).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from django.db.models import QuerySet, TextField
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce

from orchestration.models import ServiceCall

# The columns of the status page's rows (templates/dashboard/calls.html).
LIST_COLUMNS = (
    "service_call_id",
    "tenant_id",
    "name",
    "status",
    "submitted_at",
    "due_at",
    "started_at",
    "finished_at",
    "attempts",
    "error_kind",
)


def _scoped(qs: QuerySet, tenant_ids: Collection[str] | None, field: str = "tenant_id") -> QuerySet:
    return qs if tenant_ids is None else qs.filter(**{f"{field}__in": list(tenant_ids)})


def call_list_rows(queryset: QuerySet[ServiceCall]) -> QuerySet[ServiceCall]:
    """A (filtered) list of calls as the status page shows it: its columns, and the outcome cut
    down in SQL to `outcome_status`, `outcome_kind` and `outcome_latency_ms`.

    The stored outcome holds the response's headers and a body snippet (up to
    RESPONSE_BODY_SNIPPET_BYTES), the request its body: a page of rows reads neither column.
    While a retry is Scheduled, these describe the last attempt (error_kind is then empty).
    """
    return queryset.only(*LIST_COLUMNS).annotate(
        outcome_status=Coalesce(KT("outcome_meta__responseMeta__status"), KT("outcome_meta__errorMeta__status")),
        outcome_kind=Coalesce("error_kind", KT("outcome_meta__errorMeta__kind"), output_field=TextField()),
        outcome_latency_ms=Coalesce(
            KT("outcome_meta__responseMeta__latencyMs"), KT("outcome_meta__errorMeta__latencyMs")
        ),
    )


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
