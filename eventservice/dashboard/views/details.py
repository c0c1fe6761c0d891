"""The details page of a call, its live JSON, and its actions: tags, star, run again."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.errors import NotFound, ValidationFailed
from core.ids import short_id
from core.rendering import json_response
from delivery.selectors import deliveries_for_call
from eventservice.dashboard.forms import FavoriteForm, TagsForm, split_tags
from eventservice.dashboard.tenancy import tenant_required
from eventservice.dashboard.timeline import call_timeline
from eventservice.dashboard.views.common import call_for_request, json_error, redirect_back, wants_json
from execution.selectors import attempts_for_call
from orchestration.models import FAVORITE_TAG
from orchestration.representation import outcome_representation, service_call_representation
from orchestration.selectors import service_call_get, tags_of
from orchestration.services import (
    public_request_spec,
    service_call_favorite_set,
    service_call_rerun,
    service_call_tags_set,
)
from outbox.selectors import events_for_call


def _detail_url(call) -> str:
    return reverse("dashboard:call-detail", kwargs={"service_call_id": call.service_call_id})


@tenant_required
@require_GET
def call_detail(request: HttpRequest, service_call_id: uuid.UUID) -> HttpResponse:
    call = call_for_request(request, service_call_id)
    tags = tags_of(call)
    events = list(events_for_call(tenant_id=call.tenant_id, service_call_id=call.service_call_id))
    # Each event's delivery to every subscription of the tenant, all in one query.
    deliveries = deliveries_for_call(tenant_id=call.tenant_id, service_call_id=call.service_call_id)
    outcome = outcome_representation(call.outcome_meta) or {}
    context = {
        "call": call,
        "spec": public_request_spec(call.request_spec),
        "tags": [tag for tag in tags if tag != FAVORITE_TAG],
        "favorite": FAVORITE_TAG in tags,
        "response": outcome.get("responseMeta"),
        "error": outcome.get("errorMeta"),
        "attempts": list(attempts_for_call(tenant_id=call.tenant_id, service_call_id=call.service_call_id)),
        "events": events,
        "event_rows": [(event, deliveries.get(event.event_id, [])) for event in events],
        "timeline": call_timeline(call, events),
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
    call = call_for_request(request, service_call_id)
    try:
        new_call = service_call_rerun(
            tenant_id=call.tenant_id, service_call_id=call.service_call_id, correlation_id=request.correlation_id
        )
    except NotFound:
        return redirect_back(request, _detail_url(call))
    except ValidationFailed as exc:  # a stored request validation now refuses (docs/security.md §1)
        for field_messages in exc.errors.values():
            for message in field_messages:
                messages.error(request, message)
        return redirect_back(request, _detail_url(call))
    messages.success(request, f"Submitted again as {short_id(new_call.service_call_id)}.")
    return HttpResponseRedirect(_detail_url(new_call))


def _invalid(form) -> ValidationFailed:
    return ValidationFailed({name: list(errors) for name, errors in form.errors.items()})
