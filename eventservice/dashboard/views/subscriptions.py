"""The Subscriptions pages: the current tenant's webhook subscriptions, each with its figures
and delivery log, and their actions (enable or disable, rotate the secret, send a test event,
recover, resend, delete). Thin: delivery's services and selectors do the work (docs/events.md).

A signing secret is shown once, on the page after the create or the rotation: it is kept
sealed in the session for that one display and removed as it is shown, never put in a URL.
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.errors import NotFound, ValidationFailed
from delivery.models import Notification, Subscription
from delivery.selectors import (
    notification_get,
    notifications_for_subscription,
    open_counts,
    subscription_figures,
    subscription_get,
    subscriptions_for_tenant,
)
from delivery.services import (
    PING_TYPE,
    notification_resend,
    subscription_create,
    subscription_delete,
    subscription_recover,
    subscription_rotate_secret,
    subscription_send_test,
    subscription_update,
)
from delivery.validation import validate_subscription
from eventservice.api.throttles import PingThrottle, page_over_ceiling
from eventservice.dashboard.subscription_forms import RecoverForm, SubscriptionEnabledForm, SubscriptionForm
from eventservice.dashboard.tenancy import tenant_required
from eventservice.dashboard.views.common import keep_secret_once, redirect_back, take_secret

DELIVERIES_PER_PAGE = 25


def _subscription(request: HttpRequest, subscription_id: uuid.UUID) -> Subscription:
    """The current tenant's subscription, else 404 (another tenant's id looks like a missing one)."""
    try:
        return subscription_get(tenant_id=request.tenant.id, subscription_id=subscription_id)
    except NotFound:
        raise Http404("No such subscription.") from None


def _detail_url(subscription: Subscription) -> str:
    return reverse("dashboard:subscription-detail", kwargs={"subscription_id": subscription.subscription_id})


@tenant_required
@require_GET
def subscriptions_page(request: HttpRequest) -> HttpResponse:
    subscriptions = list(subscriptions_for_tenant(tenant_id=request.tenant.id).order_by("created_at"))
    pending = open_counts(subscription_ids=[s.pk for s in subscriptions])
    rows = [{"subscription": s, "pending": pending.get(s.pk, 0)} for s in subscriptions]
    return render(request, "dashboard/subscriptions.html", {"rows": rows})


@never_cache
@tenant_required
@require_http_methods(["GET", "POST"])
def subscription_new(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return render(request, "dashboard/subscription_new.html", {"form": SubscriptionForm()})
    form = SubscriptionForm(request.POST)
    parsed = form.is_valid()
    try:
        data = validate_subscription(form.wire_data())
    except ValidationFailed as exc:
        form.add_wire_errors(exc.errors)
        return render(request, "dashboard/subscription_new.html", {"form": form}, status=400)
    if not parsed:
        return render(request, "dashboard/subscription_new.html", {"form": form}, status=400)
    try:
        subscription, secret = subscription_create(tenant_id=request.tenant.id, data=data)
    except ValidationFailed as exc:  # the tenant's limit of subscriptions
        form.add_wire_errors(exc.errors)
        return render(request, "dashboard/subscription_new.html", {"form": form}, status=400)
    if secret:
        keep_secret_once(request, f"subscription:{subscription.pk}", secret)
    messages.success(request, f"Subscription “{subscription.name}” created.")
    return HttpResponseRedirect(_detail_url(subscription))


@never_cache
@tenant_required
@require_GET
def subscription_detail(request: HttpRequest, subscription_id: uuid.UUID) -> HttpResponse:
    subscription = _subscription(request, subscription_id)
    state = request.GET.get("state") or ""
    if state not in Notification.State.values:
        state = ""
    deliveries = notifications_for_subscription(subscription=subscription, state=state or None).order_by(
        "-created_at", "-event_seq"
    )
    page = Paginator(deliveries, DELIVERIES_PER_PAGE).get_page(request.GET.get("page"))
    figures = subscription_figures(subscription_ids=[subscription.pk]).get(subscription.pk)
    context = {
        "subscription": subscription,
        "secret": take_secret(request, f"subscription:{subscription.pk}"),
        "figures": figures,
        "page": page,
        "state": state,
        "states": Notification.State.values,
        "recover_form": RecoverForm(),
        # A test event's aggregate is no call: it gets no link to one.
        "ping_type": PING_TYPE,
    }
    return render(request, "dashboard/subscription_detail.html", context)


@tenant_required
@require_POST
def subscription_enabled(request: HttpRequest, subscription_id: uuid.UUID) -> HttpResponse:
    subscription = _subscription(request, subscription_id)
    form = SubscriptionEnabledForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose to enable or to disable the subscription.")
        return HttpResponseRedirect(_detail_url(subscription))
    enabled = form.cleaned_data["enabled"]
    data = validate_subscription({"enabled": enabled}, partial=True)
    try:
        subscription_update(tenant_id=request.tenant.id, subscription_id=subscription.pk, data=data)
    except NotFound:
        raise Http404("No such subscription.") from None
    if enabled:
        messages.success(
            request, "Subscription enabled. What failed while it was off stays failed: recover it below to send it."
        )
    else:
        messages.success(
            request,
            "Subscription disabled: nothing is sent to it; new events wait for it (those older than the"
            " delivery expiry when it is enabled again expire, and can be recovered).",
        )
    return HttpResponseRedirect(_detail_url(subscription))


@tenant_required
@require_POST
def subscription_rotate(request: HttpRequest, subscription_id: uuid.UUID) -> HttpResponse:
    subscription = _subscription(request, subscription_id)
    try:
        subscription, secret = subscription_rotate_secret(tenant_id=request.tenant.id, subscription_id=subscription.pk)
    except NotFound:
        raise Http404("No such subscription.") from None
    keep_secret_once(request, f"subscription:{subscription.pk}", secret)
    messages.success(request, "A new signing secret was made; the previous one keeps signing for 24 hours.")
    return HttpResponseRedirect(_detail_url(subscription))


@tenant_required
@require_POST
def subscription_test(request: HttpRequest, subscription_id: uuid.UUID) -> HttpResponse:
    subscription = _subscription(request, subscription_id)
    over = page_over_ceiling(PingThrottle, request, request.tenant.id)
    if over:
        messages.error(request, f"No test event was sent. {over}")
        return HttpResponseRedirect(_detail_url(subscription))
    try:
        subscription_send_test(tenant_id=request.tenant.id, subscription_id=subscription.pk)
    except NotFound:
        raise Http404("No such subscription.") from None
    if subscription.enabled:
        messages.success(request, "A test event (ServiceAgentPing) is on its way; it shows in the delivery log.")
    else:
        messages.info(request, "A test event (ServiceAgentPing) waits in the delivery log until you enable this.")
    return HttpResponseRedirect(_detail_url(subscription))


@tenant_required
@require_POST
def subscription_recover_view(request: HttpRequest, subscription_id: uuid.UUID) -> HttpResponse:
    subscription = _subscription(request, subscription_id)
    form = RecoverForm(request.POST)
    if not form.is_valid():
        for field_errors in form.errors.values():
            for message in field_errors:
                messages.error(request, message)
        return HttpResponseRedirect(_detail_url(subscription))
    try:
        count = subscription_recover(
            tenant_id=request.tenant.id, subscription_id=subscription.pk, since=form.cleaned_data["since_at"]
        )
    except NotFound:
        raise Http404("No such subscription.") from None
    messages.success(request, f"{count} failed or expired deliver{'y' if count == 1 else 'ies'} requeued.")
    return HttpResponseRedirect(_detail_url(subscription))


@tenant_required
@require_http_methods(["GET", "POST"])
def subscription_delete_view(request: HttpRequest, subscription_id: uuid.UUID) -> HttpResponse:
    """GET: the confirmation step; POST: delete it with its deliveries."""
    subscription = _subscription(request, subscription_id)
    if request.method == "GET":
        return render(request, "dashboard/subscription_delete.html", {"subscription": subscription})
    try:
        subscription_delete(tenant_id=request.tenant.id, subscription_id=subscription.pk)
    except NotFound:
        raise Http404("No such subscription.") from None
    messages.success(request, f"Subscription “{subscription.name}” deleted.")
    return HttpResponseRedirect(reverse("dashboard:subscriptions"))


@tenant_required
@require_POST
def delivery_resend(request: HttpRequest, subscription_id: uuid.UUID, notification_id: uuid.UUID) -> HttpResponse:
    subscription = _subscription(request, subscription_id)
    try:
        notification = notification_get(tenant_id=request.tenant.id, notification_id=notification_id)
        if notification.subscription_id != subscription.pk:
            raise NotFound("Not a delivery of this subscription.")
        over = page_over_ceiling(PingThrottle, request, request.tenant.id)
        if over:
            messages.error(request, f"Not sent again. {over}")
            return redirect_back(request, _detail_url(subscription))
        notification_resend(tenant_id=request.tenant.id, notification_id=notification.pk)
    except NotFound:
        raise Http404("No such delivery.") from None
    messages.success(request, f"{notification.event_type} will be sent again now.")
    return redirect_back(request, _detail_url(subscription))
