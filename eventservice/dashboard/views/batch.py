"""The batch page (docs/api.md, "Batches"): up to 100 calls pasted or uploaded as the API takes
them (`{"calls": [...]}`), each accepted or refused on its own, the answer a line per item in
order. Thin: orchestration checks and stores the batch exactly as for the API and `manage.py
submit_calls`, and its calls are charged to the submissions ceiling as the API's are."""

from __future__ import annotations

import json

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from core.errors import ValidationFailed
from eventservice.api.throttles import CountedSubmissionThrottle, page_over_ceiling
from eventservice.dashboard.tenancy import tenant_required
from orchestration.many import BATCH_MAX, validate_batch
from orchestration.services.batch import service_calls_submit_batch
from orchestration.validation import MAX_DOCUMENT_DEPTH, nested_deeper_than

EXAMPLE = {
    "calls": [
        {"name": "Invoice 1", "requestSpec": {"method": "POST", "url": "https://api.example.com/invoices"}},
        {"name": "Invoice 2", "requestSpec": {"method": "POST", "url": "https://api.example.com/invoices"}},
    ]
}


def _document(request: HttpRequest) -> tuple[object, str]:
    """The batch the form sent (the file when one is chosen, else the text) and its text."""
    if int(request.META.get("CONTENT_LENGTH") or 0) > 2 * settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
        raise ValidationFailed({"file": [f"Larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."]})
    upload = request.FILES.get("file")
    if upload is not None and upload.size > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
        # What the API takes in one request (MAX_REQUEST_BYTES) is the bound of a file too.
        raise ValidationFailed({"file": [f"Larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."]})
    text = upload.read().decode("utf-8", "replace") if upload else request.POST.get("batch", "")
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValidationFailed({"body": [f"Nested deeper than {MAX_DOCUMENT_DEPTH} levels."]}) from None
    except ValueError as exc:
        raise ValidationFailed({"body": [f"Not JSON: {exc}."]}) from None
    if nested_deeper_than(data, MAX_DOCUMENT_DEPTH):
        raise ValidationFailed({"body": [f"Nested deeper than {MAX_DOCUMENT_DEPTH} levels."]})
    return data, text


@tenant_required
@require_http_methods(["GET", "POST"])
def batch_page(request: HttpRequest) -> HttpResponse:
    context = {"example": json.dumps(EXAMPLE, indent=2), "limit": BATCH_MAX, "text": ""}
    if request.method == "GET":
        return render(request, "dashboard/batch.html", context)
    try:
        data, context["text"] = _document(request)
        items = validate_batch(data)
    except ValidationFailed as exc:
        context["problems"] = [f"{name}: {' '.join(found)}" for name, found in exc.errors.items()]
        return render(request, "dashboard/batch.html", context, status=400)
    over = page_over_ceiling(CountedSubmissionThrottle, request, request.tenant.id, count=len(items))
    if over:
        context["problems"] = [f"Nothing was submitted. {over}"]
        return render(request, "dashboard/batch.html", context, status=429)
    results = service_calls_submit_batch(
        tenant_id=request.tenant.id, items=items, correlation_id=request.correlation_id
    )
    rows = []
    for index, result in enumerate(results, start=1):
        if result.error is not None:
            found = result.error.errors or {"": [result.error.detail]}
            said = "; ".join(f"{name}: {' '.join(m)}" if name else " ".join(m) for name, m in found.items())
            rows.append({"index": index, "state": "Refused", "problem": said})
        else:
            rows.append(
                {"index": index, "state": "Accepted" if result.created else "Stored earlier", "call": result.call}
            )
    context["rows"] = rows
    context["accepted"] = sum(1 for row in rows if row["state"] == "Accepted")
    context["refused"] = sum(1 for row in rows if row["state"] == "Refused")
    return render(request, "dashboard/batch.html", context)
