"""The Calls page's bulk actions (docs/api.md, "Bulk actions"): cancel, run again, or add or
remove a tag on every call the page's filters match. The page's form leads to a confirm step
that counts them first (as the API's `dryRun`); the confirmed POST does it and goes back to the
list with what changed. Thin: orchestration's bulk service does the work, exactly as for the API
and `manage.py bulk_calls`, and a bulk rerun is charged to the submissions ceiling as the API's."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from core.errors import ValidationFailed
from eventservice.api.throttles import CountedSubmissionThrottle, page_over_ceiling
from eventservice.dashboard.tenancy import tenant_required
from orchestration.many import BULK_FILTERS, validate_bulk
from orchestration.services.bulk import BULK_MAX, bulk_calls_matched, service_calls_bulk

# What each action is called on the page: (the button, what is done, done).
ACTIONS = {
    "cancel": ("Cancel them", "cancel", "cancelled"),
    "rerun": ("Run them again", "run again (each as a new call)", "made again"),
    "addTags": ("Add the tag", "tag", "tagged"),
    "removeTags": ("Remove the tag", "untag", "untagged"),
}


def _wire(params: QueryDict) -> dict[str, Any]:
    """The bulk action the form sent, in the API's wire shape (the filters the page's own)."""
    found: dict[str, Any] = {}
    for name in BULK_FILTERS:
        values = [value for value in params.getlist(name) if value]
        if values:
            found[name] = values if name in ("status", "tag") else values[-1]
    tag = params.get("bulkTag", "").strip()
    action = params.get("action", "")
    return {"action": action, "filter": found, **({"tags": [tag]} if action in ("addTags", "removeTags") else {})}


def _list_url(filters: dict[str, Any]) -> str:
    query = QueryDict(mutable=True)
    for name, value in filters.items():
        query.setlist(name, value if isinstance(value, list) else [value])
    return reverse("dashboard:calls") + (f"?{query.urlencode()}" if query else "")


@tenant_required
@require_http_methods(["GET", "POST"])
def calls_bulk(request: HttpRequest) -> HttpResponse:
    tenant_id = request.tenant.id
    params = request.POST if request.method == "POST" else request.GET
    data = _wire(params)
    back = _list_url(data["filter"])
    try:
        bulk = validate_bulk({**data, "dryRun": request.method == "GET"})
        calls = bulk_calls_matched(tenant_id=tenant_id, bulk=bulk)
        if request.method == "GET":
            result = service_calls_bulk(
                tenant_id=tenant_id, calls=calls, action=bulk.action, tags=bulk.tags, dry_run=True, correlation_id=""
            )
            context = {
                "action": bulk.action,
                "words": ACTIONS[bulk.action],
                "tags": bulk.tags,
                "matched": result.matched,
                "limit": BULK_MAX,
                "hidden": [
                    (name, value)
                    for name, values in params.lists()
                    for value in values
                    if name != "csrfmiddlewaretoken"
                ],
                "back": back,
            }
            return render(request, "dashboard/calls_bulk.html", context)
        if bulk.action == "rerun":
            over = page_over_ceiling(CountedSubmissionThrottle, request, tenant_id, count=min(calls.count(), BULK_MAX))
            if over:
                messages.error(request, f"Nothing was run again. {over}")
                return HttpResponseRedirect(back)
        result = service_calls_bulk(
            tenant_id=tenant_id,
            calls=calls,
            action=bulk.action,
            tags=bulk.tags,
            dry_run=False,
            correlation_id=request.correlation_id,
        )
    except ValidationFailed as exc:
        problems = [f"{name}: {' '.join(found)}" for name, found in exc.errors.items()]
        return render(request, "dashboard/calls_bulk.html", {"problems": problems, "back": back}, status=400)
    said = f"{result.changed} of {result.matched} calls {ACTIONS[bulk.action][2]}"
    if result.unchanged:
        said += f"; {result.unchanged} already so"
    if result.skipped:
        said += "; skipped: " + ", ".join(f"{n} {reason}" for reason, n in result.reasons.items())
    messages.success(request, said + ".")
    return HttpResponseRedirect(back)
