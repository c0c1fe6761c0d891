"""The status page ("all calls") and the small JSON feed that keeps its statuses live."""

from __future__ import annotations

import uuid

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from core.ids import iso_ms
from eventservice.dashboard.selectors import call_list_rows
from eventservice.dashboard.templatetags.dashboard import outcome
from eventservice.dashboard.tenancy import member_tenant, tenant_required
from orchestration.filters import ServiceCallFilter
from orchestration.models import FAVORITE_TAG, ServiceCall
from orchestration.selectors import service_calls_for_tenant, tags_of

PAGE_SIZES = (10, 25, 50, 100)
DEFAULT_PAGE_SIZE = 25
MAX_LIVE_IDS = 200
# The filters' query parameters (the API's names, so a list's URL reads the same in both) as the
# page labels them: an error names the control, not the parameter.
FILTER_LABELS = {
    "status": "Status",
    "tag": "Tags",
    "q": "Search names",
    "submittedFrom": "Submitted from",
    "submittedTo": "Submitted to",
    "dueFrom": "Due from",
    "dueTo": "Due to",
    "favorite": "Show favorites",
}


def _page_size(raw: str | None) -> int:
    try:
        size = int(raw or DEFAULT_PAGE_SIZE)
    except ValueError:
        return DEFAULT_PAGE_SIZE
    return size if size in PAGE_SIZES else DEFAULT_PAGE_SIZE


@tenant_required
@require_GET
def calls_page(request: HttpRequest) -> HttpResponse:
    # A shared link names its tenant. A member of it is offered the switch (a POST) and comes
    # back to the same link; the link alone never switches. Anyone else sees their own list.
    wanted = request.GET.get("tenant")
    if wanted and wanted != request.tenant.id:
        other = member_tenant(request, wanted)
        if other is not None:
            return render(request, "dashboard/tenant_prompt.html", {"other": other, "next": request.get_full_path()})
    tenant_id = request.tenant.id
    filterset = ServiceCallFilter(
        request.GET, queryset=service_calls_for_tenant(tenant_id=tenant_id), tenant_id=tenant_id
    )
    valid = filterset.is_valid()
    filter_errors = {} if valid else filterset.errors
    queryset = call_list_rows(filterset.qs) if valid else ServiceCall.objects.none()
    per_page = _page_size(request.GET.get("per"))
    page = Paginator(queryset, per_page).get_page(request.GET.get("page"))
    rows = []
    for call in page.object_list:
        tags = tags_of(call)
        rows.append({"call": call, "favorite": FAVORITE_TAG in tags, "tags": [t for t in tags if t != FAVORITE_TAG]})
    context = {
        "filterset": filterset,
        "filter_errors": [(FILTER_LABELS.get(name, name), messages) for name, messages in filter_errors.items()],
        "invalid_filters": set(filter_errors),
        "page": page,
        "rows": rows,
        "per_page": per_page,
        "page_sizes": PAGE_SIZES,
        "statuses": ServiceCall.Status.values,
        # As the filter read them (any letter case), so `?status=failed` ticks "Failed".
        "selected_statuses": list(filterset.form.cleaned_data.get("status") or []) if valid else [],
        "selected_tags": list(dict.fromkeys(t for t in request.GET.getlist("tag") if t)),
        "favorites_only": request.GET.get("favorite", "").lower() == "true",
        "q": request.GET.get("q", ""),
        "submitted_from": request.GET.get("submittedFrom", ""),
        "submitted_to": request.GET.get("submittedTo", ""),
        "due_from": request.GET.get("dueFrom", ""),
        "due_to": request.GET.get("dueTo", ""),
        "filtered": any(
            request.GET.get(name)
            for name in (
                "status",
                "tag",
                "q",
                "submittedFrom",
                "submittedTo",
                "dueFrom",
                "dueTo",
                "favorite",
            )
        ),
    }
    return render(request, "dashboard/calls.html", context, status=200 if valid else 400)


@tenant_required
@require_GET
def calls_live(request: HttpRequest) -> JsonResponse:
    """Statuses, times and outcomes of the given calls of the current tenant (`?id=...` repeated);
    `outcomeHtml` is the row's outcome cell as the page renders it."""
    ids = []
    for raw in request.GET.getlist("id")[:MAX_LIVE_IDS]:
        try:
            ids.append(uuid.UUID(raw))
        except ValueError:
            continue
    # No tags here: a live row changes only its status, times and outcome.
    calls = call_list_rows(service_calls_for_tenant(tenant_id=request.tenant.id).filter(pk__in=ids))
    calls = calls.prefetch_related(None)
    return JsonResponse(
        {
            "calls": [
                {
                    "serviceCallId": str(call.service_call_id),
                    "status": call.status,
                    "dueAt": iso_ms(call.due_at),
                    "startedAt": iso_ms(call.started_at),
                    "finishedAt": iso_ms(call.finished_at),
                    "errorKind": call.error_kind,
                    "outcomeHtml": outcome(call),
                }
                for call in calls
            ]
        }
    )
