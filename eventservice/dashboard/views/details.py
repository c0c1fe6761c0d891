"""The details page of a call, its live JSON, and its actions: tags, star, run again, cancel."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.errors import Conflict, NotFound, ValidationFailed
from core.ids import iso_ms, short_id
from core.rendering import json_response
from delivery.selectors import deliveries_for_call
from eventservice.api.throttles import SubmissionThrottle, page_over_ceiling
from eventservice.dashboard.forms import FavoriteForm, RerunForm, TagsForm, page_message, split_tags
from eventservice.dashboard.tenancy import tenant_required
from eventservice.dashboard.timeline import call_timeline
from eventservice.dashboard.views.common import call_for_request, json_error, redirect_back, wants_json
from execution.selectors import attempts_for_call
from orchestration.models import FAVORITE_TAG
from orchestration.representation import outcome_representation, service_call_representation
from orchestration.selectors import service_call_get, tags_of
from orchestration.services import (
    public_request_spec,
    service_call_cancel,
    service_call_favorite_set,
    service_call_rerun,
    service_call_tags_set,
)
from orchestration.validation import validate_rerun
from outbox.selectors import events_for_call


def _detail_url(call) -> str:
    return reverse("dashboard:call-detail", kwargs={"service_call_id": call.service_call_id})


@tenant_required
@require_GET
def call_detail(request: HttpRequest, service_call_id: uuid.UUID) -> HttpResponse:
    call = call_for_request(request, service_call_id)
    tags = tags_of(call)
    events = list(events_for_call(tenant_id=call.tenant_id, service_call_id=call.service_call_id))
    attempts = list(attempts_for_call(tenant_id=call.tenant_id, service_call_id=call.service_call_id))
    # Each event's delivery to every subscription of the tenant, all in one query.
    deliveries = deliveries_for_call(tenant_id=call.tenant_id, service_call_id=call.service_call_id)
    # While a retry waits, the stored outcome is the failed attempt's error, not the call's outcome.
    outcome = (outcome_representation(call.outcome_meta) or {}) if call.is_terminal else {}
    last_error = None if call.is_terminal else (outcome_representation(call.outcome_meta) or {}).get("errorMeta")
    context = {
        "call": call,
        "spec": public_request_spec(call.request_spec),
        "tags": [tag for tag in tags if tag != FAVORITE_TAG],
        "favorite": FAVORITE_TAG in tags,
        "response": outcome.get("responseMeta"),
        "error": outcome.get("errorMeta"),
        "last_error": last_error,
        "max_attempts": (call.retry_policy or {}).get("maxAttempts", 1),
        "attempts": attempts,
        "events": events,
        "event_rows": [(event, deliveries.get(event.event_id, [])) for event in events],
        "timeline": call_timeline(call, events, attempts),
        "rerun_form": RerunForm(auto_id="rerun_%s"),
    }
    return render(request, "dashboard/call_detail.html", context)


@tenant_required
@require_GET
def call_live(request: HttpRequest, service_call_id: uuid.UUID) -> JsonResponse:
    """The call as the API shows it, for pages that follow it while it runs."""
    call = call_for_request(request, service_call_id)
    return json_response(service_call_representation(call))


@tenant_required
@require_POST
def call_tags(request: HttpRequest, service_call_id: uuid.UUID) -> HttpResponse:
    """Replace the tags shown in the editor; the star (tag `favorite`) is kept as it is."""
    call = call_for_request(request, service_call_id)
    form = TagsForm(request.POST)
    try:
        if not form.is_valid():
            raise _invalid(form)
        service_call_tags_set(
            tenant_id=call.tenant_id,
            service_call_id=call.service_call_id,
            tags=split_tags(form.cleaned_data["tags"]),
            keep_favorite=True,
            correlation_id=request.correlation_id,
        )
    except ValidationFailed as exc:
        if wants_json(request):
            return json_error(exc.detail, status=400, errors=exc.errors)
        for message in exc.errors.get("tags", [exc.detail]):
            messages.error(request, message)
        return redirect_back(request, _detail_url(call))
    if wants_json(request):
        fresh = service_call_get(tenant_id=call.tenant_id, service_call_id=call.service_call_id)
        return JsonResponse({"tags": tags_of(fresh)})
    messages.success(request, "Tags saved.")
    return redirect_back(request, _detail_url(call))


@tenant_required
@require_POST
def call_favorite(request: HttpRequest, service_call_id: uuid.UUID) -> HttpResponse:
    call = call_for_request(request, service_call_id)
    form = FavoriteForm(request.POST)
    try:
        if not form.is_valid():
            raise _invalid(form)
        favorite = form.cleaned_data["favorite"]
        service_call_favorite_set(
            tenant_id=call.tenant_id,
            service_call_id=call.service_call_id,
            favorite=favorite,
            correlation_id=request.correlation_id,
        )
    except ValidationFailed as exc:  # e.g. already 20 tags: the star would be the 21st
        if wants_json(request):
            return json_error(exc.detail, status=400, errors=exc.errors)
        messages.error(request, exc.detail)
        return redirect_back(request, _detail_url(call))
    if wants_json(request):
        return JsonResponse({"serviceCallId": str(call.service_call_id), "favorite": favorite})
    return redirect_back(request, _detail_url(call))


@tenant_required
@require_POST
def call_rerun(request: HttpRequest, service_call_id: uuid.UUID) -> HttpResponse:
    """A new call with the same request, now or at the chosen time (checked as the API checks a
    rerun's dueAt, with the page's words)."""
    call = call_for_request(request, service_call_id)
    form = RerunForm(request.POST)
    try:
        if not form.is_valid():
            raise _invalid(form)
        due_at = validate_rerun(form.wire_data())
        over = page_over_ceiling(SubmissionThrottle, request, call.tenant_id)
        if over:
            messages.error(request, f"Not submitted again. {over}")
            return redirect_back(request, _detail_url(call))
        new_call = service_call_rerun(
            tenant_id=call.tenant_id,
            service_call_id=call.service_call_id,
            correlation_id=request.correlation_id,
            due_at=due_at,
        )
    except NotFound:
        return redirect_back(request, _detail_url(call))
    except ValidationFailed as exc:  # a bad time, or a stored request validation now refuses (docs/security.md §1)
        for field_messages in exc.errors.values():
            for message in field_messages:
                messages.error(request, page_message(message))
        return redirect_back(request, _detail_url(call))
    if new_call.due_at > new_call.submitted_at:
        due = iso_ms(new_call.due_at)[:19].replace("T", " ")
        messages.success(request, f"Submitted again as {short_id(new_call.service_call_id)}, due {due} UTC.")
    else:
        messages.success(request, f"Submitted again as {short_id(new_call.service_call_id)}.")
    return HttpResponseRedirect(_detail_url(new_call))


@tenant_required
@require_POST
def call_cancel(request: HttpRequest, service_call_id: uuid.UUID) -> HttpResponse:
    """Call off a Scheduled call (docs/retries.md, 'Cancel'); a call that started meanwhile is
    not cancelled, and the message says why."""
    call = call_for_request(request, service_call_id)
    try:
        service_call_cancel(
            tenant_id=call.tenant_id, service_call_id=call.service_call_id, correlation_id=request.correlation_id
        )
    except Conflict:
        call.refresh_from_db()
        message = f"Not cancelled: the call is {call.status} already. Only a Scheduled call can be cancelled."
        if wants_json(request):
            return json_error(message, status=409)
        messages.error(request, message)
        return redirect_back(request, _detail_url(call))
    if wants_json(request):
        return JsonResponse({"serviceCallId": str(call.service_call_id), "status": "Cancelled"})
    messages.success(request, f"Cancelled {short_id(call.service_call_id)}: it will not run.")
    return redirect_back(request, _detail_url(call))


def _invalid(form) -> ValidationFailed:
    return ValidationFailed({name: list(errors) for name, errors in form.errors.items()})
