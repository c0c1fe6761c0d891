"""The request page: define a call (or start from a copy of one), run it now or schedule it, then
follow it live."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from core.errors import Conflict, NotFound, ValidationFailed
from eventservice.api.throttles import SubmissionThrottle, page_over_ceiling
from eventservice.dashboard.forms import RequestForm
from eventservice.dashboard.tenancy import tenant_required
from execution.connections import connections_list
from orchestration.models import FAVORITE_TAG, ServiceCall
from orchestration.selectors import service_call_get, tags_of
from orchestration.services import service_call_submit
from orchestration.validation import validate_submission


@tenant_required
@require_http_methods(["GET", "POST"])
def request_page(request: HttpRequest) -> HttpResponse:
    call = None
    context: dict = {}
    if request.method == "POST":
        form = RequestForm(request.POST, header_rows=RequestForm.rows_from(request.POST))
        call = _submit(request, form)
        if call is not None:
            # The same values stay in the form to tweak and send again, under a new key.
            data = request.POST.copy()
            data["idempotency_key"] = RequestForm.new_idempotency_key()
            data["due_at"] = ""
            form = RequestForm(data, header_rows=form.header_rows)
            form.is_valid()
    elif request.GET.get("from"):
        copied_from = _copy_source(request, request.GET["from"])
        form = RequestForm.copy_of(copied_from, tags=[tag for tag in tags_of(copied_from) if tag != FAVORITE_TAG])
        context["copied_from"] = copied_from
        context["secret_names"] = sorted(form.secret_names, key=str.lower)
    else:
        form = RequestForm(initial={"idempotency_key": RequestForm.new_idempotency_key()})
    status = 400 if request.method == "POST" and call is None else 200
    context["connection_names"] = [c.name for c in connections_list(tenant_id=request.tenant.id)]
    return render(request, "dashboard/request.html", {**context, "form": form, "call": call}, status=status)


def _copy_source(request: HttpRequest, raw_id: str) -> ServiceCall:
    """The call to copy: one of the current tenant's, whatever other tenants the user has (the
    copy is submitted under the current one); anything else is 404."""
    try:
        return service_call_get(tenant_id=request.tenant.id, service_call_id=raw_id)
    except NotFound:
        raise Http404("No such service call.") from None


def _submit(request: HttpRequest, form: RequestForm):
    parsed = form.is_valid()
    try:
        submission = validate_submission(form.wire_data())
    except ValidationFailed as exc:
        form.add_wire_errors(exc.errors)
        return None
    if not parsed:
        return None
    over = page_over_ceiling(SubmissionThrottle, request, request.tenant.id)
    if over:
        form.add_error(None, f"Not submitted. {over}")
        return None
    try:
        call, created = service_call_submit(
            tenant_id=request.tenant.id, submission=submission, correlation_id=request.correlation_id
        )
    except ValidationFailed as exc:
        form.add_wire_errors(exc.errors)
        return None
    except Conflict as exc:
        form.add_error(None, exc.detail)
        return None
    if not created:
        messages.info(request, "This form was already submitted; showing the call it created.")
    return call
