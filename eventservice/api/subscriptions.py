"""The REST API of a tenant's event subscriptions and their deliveries (docs/api.md,
"Subscriptions"; docs/events.md): one view per operation, thin.

Input is checked by delivery.validation, state changes go through delivery.services, reads
through delivery.selectors, and output through delivery.representation. A tenant sees its own
subscriptions only: the operator-wide ones (no tenant) are not reachable here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from core.errors import ValidationFailed
from core.ids import utcnow
from delivery.models import Notification, Subscription
from delivery.representation import notification_representation, subscription_representation
from delivery.selectors import (
    notification_get,
    notifications_for_subscription,
    subscription_figures,
    subscription_get,
    subscriptions_for_tenant,
)
from delivery.services import (
    notification_resend,
    subscription_create,
    subscription_delete,
    subscription_recover,
    subscription_rotate_secret,
    subscription_send_test,
    subscription_update,
)
from delivery.validation import validate_subscription
from eventservice.api import subscription_serializers as ss
from eventservice.api.base import TenantCollectionApi, keyset_page, paging_params
from eventservice.api.schema import PAGING_PARAMS, TENANT_PARAM, problem_responses
from eventservice.api.throttles import PingThrottle

SUBSCRIPTION_PARAM = OpenApiParameter("subscription_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
NOTIFICATION_PARAM = OpenApiParameter(
    "notification_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="A delivery's `notificationId`."
)
STATES = Notification.State.values
MAX_SINCE = 64


_problems = problem_responses(
    {
        404: "No such tenant, subscription or delivery for this caller.",
        429: "Past the tenant's ceiling (`Retry-After` says when to try again).",
    }
)


def _subscription(request: Request, subscription: Subscription) -> dict[str, Any]:
    figures = subscription_figures(subscription_ids=[subscription.subscription_id])
    return subscription_representation(subscription, figures=figures.get(subscription.subscription_id), request=request)


# An answer that carries a secret is kept by no cache, shared or the browser's (docs/security.md,
# "Secrets shown once").
SECRET_HEADERS = {"Cache-Control": "no-store"}


class SubscriptionBaseApi(TenantCollectionApi):
    """The base of the views of the tenant's subscriptions and their deliveries."""

    item_name = "Subscription"


class SubscriptionListApi(SubscriptionBaseApi):
    """GET the tenant's own subscriptions, newest first, cursor-paginated."""

    @extend_schema(
        operation_id="subscriptions_list",
        summary="List subscriptions",
        description="The tenant's own subscriptions with their figures, newest first, with cursor pagination.",
        parameters=[TENANT_PARAM, *PAGING_PARAMS],
        responses={200: ss.SubscriptionPageSerializer, **_problems(400, 401, 404)},
    )
    def get(self, request: Request, tenant_id: str) -> Response:
        page = self.page_of(subscriptions_for_tenant(tenant_id=self.tenant_id))
        figures = subscription_figures(subscription_ids=[row.subscription_id for row in page.items])
        return self.page_response(
            page,
            lambda row: subscription_representation(row, figures=figures.get(row.subscription_id), request=request),
        )


class SubscriptionCreateApi(SubscriptionBaseApi):
    """POST a webhook subscription: 201 with its signing secret, shown this once."""

    @extend_schema(
        operation_id="subscriptions_create",
        summary="Create a webhook subscription",
        description=(
            "The tenant's events from now on are delivered to `url` (Standard Webhooks). The answer "
            "holds the signing `secret`: the only time it is shown."
        ),
        parameters=[TENANT_PARAM],
        request=ss.CreateSubscriptionSerializer,
        responses={
            201: OpenApiResponse(ss.CreatedSubscriptionSerializer, description="Created; `Location` names it."),
            **_problems(400, 401, 403, 404, 413),
        },
    )
    def post(self, request: Request, tenant_id: str) -> Response:
        data = validate_subscription(request.data)
        subscription, secret = subscription_create(tenant_id=self.tenant_id, data=data)
        # Just created: no deliveries yet, so no figures to read.
        body = {**subscription_representation(subscription, request=request), "secret": secret}
        return Response(
            body, status=status.HTTP_201_CREATED, headers={"Location": body["links"]["self"], **SECRET_HEADERS}
        )


class SubscriptionsApi(SubscriptionListApi, SubscriptionCreateApi):
    """The collection path: GET is SubscriptionListApi.get, POST is SubscriptionCreateApi.post."""


class SubscriptionGetApi(SubscriptionBaseApi):
    @extend_schema(
        operation_id="subscriptions_retrieve",
        summary="Get a subscription with its figures",
        parameters=[TENANT_PARAM, SUBSCRIPTION_PARAM],
        responses={200: ss.SubscriptionSerializer, **_problems(401, 404)},
    )
    def get(self, request: Request, tenant_id: str, subscription_id: str) -> Response:
        subscription = subscription_get(tenant_id=self.tenant_id, subscription_id=subscription_id)
        return Response(_subscription(request, subscription))


class SubscriptionUpdateApi(SubscriptionBaseApi):
    @extend_schema(
        operation_id="subscriptions_update",
        summary="Change a subscription",
        description=(
            "Changes the fields given (`name`, `url`, `eventTypes`, `enabled`); the kind cannot change. "
            "Enabling clears `disabledReason` and `failingSince`; what failed meanwhile stays failed "
            "until `recover`."
        ),
        parameters=[TENANT_PARAM, SUBSCRIPTION_PARAM],
        request=ss.UpdateSubscriptionSerializer,
        responses={200: ss.SubscriptionSerializer, **_problems(400, 401, 403, 404, 413)},
    )
    def patch(self, request: Request, tenant_id: str, subscription_id: str) -> Response:
        subscription = subscription_get(tenant_id=self.tenant_id, subscription_id=subscription_id)
        data = validate_subscription(request.data, partial=True)
        subscription = subscription_update(
            tenant_id=self.tenant_id, subscription_id=subscription.subscription_id, data=data
        )
        return Response(_subscription(request, subscription))


class SubscriptionDeleteApi(SubscriptionBaseApi):
    @extend_schema(
        operation_id="subscriptions_destroy",
        summary="Delete a subscription",
        description="Deletes it with its deliveries; nothing more is sent to it.",
        parameters=[TENANT_PARAM, SUBSCRIPTION_PARAM],
        request=None,
        responses={204: OpenApiResponse(description="Deleted."), **_problems(401, 403, 404)},
    )
    def delete(self, request: Request, tenant_id: str, subscription_id: str) -> Response:
        subscription_delete(tenant_id=self.tenant_id, subscription_id=self.item_id(subscription_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class SubscriptionDetailApi(SubscriptionGetApi, SubscriptionUpdateApi, SubscriptionDeleteApi):
    """The subscription's path: GET, PATCH and DELETE, one view class each."""


class SubscriptionRotateSecretApi(SubscriptionBaseApi):
    @extend_schema(
        operation_id="subscriptions_rotate_secret",
        summary="Rotate a webhook's signing secret",
        description=(
            "A new signing secret, shown this once. For 24 hours deliveries are signed with both the "
            "new and the previous secret, so a receiver can switch without losing one."
        ),
        parameters=[TENANT_PARAM, SUBSCRIPTION_PARAM],
        request=None,
        responses={200: ss.SecretSerializer, **_problems(400, 401, 403, 404)},
    )
    def post(self, request: Request, tenant_id: str, subscription_id: str) -> Response:
        _, secret = subscription_rotate_secret(tenant_id=self.tenant_id, subscription_id=self.item_id(subscription_id))
        return Response({"secret": secret}, headers=SECRET_HEADERS)


class SubscriptionTestApi(SubscriptionBaseApi):
    throttle_classes = [PingThrottle]

    @extend_schema(
        operation_id="subscriptions_send_test",
        summary="Send a test event",
        description=(
            "A `ServiceAgentPing` event for this subscription alone, delivered now. At most the tenant's "
            "`testPingsPerMinute` ceiling a minute (default 10): past it, 429 with `Retry-After`."
        ),
        parameters=[TENANT_PARAM, SUBSCRIPTION_PARAM],
        request=None,
        responses={
            202: OpenApiResponse(ss.DeliverySerializer, description="The test event's delivery, queued."),
            **_problems(401, 403, 404, 429),
        },
    )
    def post(self, request: Request, tenant_id: str, subscription_id: str) -> Response:
        notification = subscription_send_test(tenant_id=self.tenant_id, subscription_id=self.item_id(subscription_id))
        return Response(notification_representation(notification, request=request), status=status.HTTP_202_ACCEPTED)


def parse_since(data: Any, *, now: datetime | None = None) -> datetime:
    """The `since` of a recover body: an ISO 8601 date-time with a zone, not in the future."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["Expected a JSON object."]})
    if set(data) - {"since"}:
        raise ValidationFailed({"body": ["Only the field `since` is accepted."]})
    raw = data.get("since")
    if raw is None or raw == "":
        raise ValidationFailed({"since": ["since is required: an ISO 8601 date-time with a time zone."]})
    if not isinstance(raw, str) or len(raw) > MAX_SINCE:
        raise ValidationFailed({"since": ["since is an ISO 8601 date-time with a time zone."]})
    text = raw.strip()
    try:
        parsed = parse_datetime(text[:-1] + "Z" if text.endswith("z") else text)
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValidationFailed(
            {"since": ["since is not a valid ISO 8601 date-time (for example 2030-01-31T09:30:00Z)."]}
        )
    if parsed.tzinfo is None:
        raise ValidationFailed({"since": ["since must carry a time zone (for example 'Z' or '+02:00')."]})
    try:
        parsed = parsed.astimezone(UTC)
    except OverflowError:
        raise ValidationFailed({"since": ["since must not be in the future."]}) from None
    if parsed > (now or utcnow()):
        raise ValidationFailed({"since": ["since must not be in the future."]})
    return parsed


class SubscriptionRecoverApi(SubscriptionBaseApi):
    @extend_schema(
        operation_id="subscriptions_recover",
        summary="Try failed deliveries again",
        description=(
            "Requeues the subscription's FAILED and EXPIRED deliveries of events since `since`, to be "
            "tried now (in order per call)."
        ),
        parameters=[TENANT_PARAM, SUBSCRIPTION_PARAM],
        request=ss.RecoverInputSerializer,
        responses={200: ss.RequeuedSerializer, **_problems(400, 401, 403, 404, 413)},
    )
    def post(self, request: Request, tenant_id: str, subscription_id: str) -> Response:
        subscription = subscription_get(tenant_id=self.tenant_id, subscription_id=subscription_id)
        since = parse_since(request.data)
        requeued = subscription_recover(
            tenant_id=self.tenant_id, subscription_id=subscription.subscription_id, since=since
        )
        return Response({"requeued": requeued})


class SubscriptionDeliveriesApi(SubscriptionBaseApi):
    @extend_schema(
        operation_id="subscriptions_deliveries",
        summary="List a subscription's deliveries",
        description="Its deliveries (one per event) with every try, newest first, with cursor pagination.",
        parameters=[
            TENANT_PARAM,
            SUBSCRIPTION_PARAM,
            OpenApiParameter("state", str, enum=STATES, description="Only deliveries in this state."),
            *PAGING_PARAMS,
        ],
        responses={200: ss.DeliveryPageSerializer, **_problems(400, 401, 404)},
    )
    def get(self, request: Request, tenant_id: str, subscription_id: str) -> Response:
        subscription = subscription_get(tenant_id=self.tenant_id, subscription_id=subscription_id)
        errors: dict[str, list[str]] = {}
        state = request.query_params.get("state") or None
        if state is not None and state not in STATES:
            errors["state"] = [f"state must be one of: {', '.join(STATES)}."]
        limit, cursor = paging_params(request, errors=errors)
        page = keyset_page(
            notifications_for_subscription(subscription=subscription, state=state),
            request,
            limit=limit,
            cursor=cursor,
        )
        return self.page_response(page, lambda row: notification_representation(row, request=request))


class DeliveryResendApi(SubscriptionBaseApi):
    # A resend sends to the tenant's address as a test ping does, and counts with them.
    throttle_classes = [PingThrottle]

    @extend_schema(
        operation_id="deliveries_resend",
        summary="Send one delivery again now",
        description=(
            "Tries it again now, whatever its state (after an earlier event of its call that is still open). "
            "Counts with the test pings under the tenant's `testPingsPerMinute` ceiling: past it, 429 with "
            "`Retry-After`."
        ),
        parameters=[TENANT_PARAM, NOTIFICATION_PARAM],
        request=None,
        responses={
            202: OpenApiResponse(ss.DeliverySerializer, description="The delivery, queued."),
            **_problems(401, 403, 404, 429),
        },
    )
    def post(self, request: Request, tenant_id: str, notification_id: str) -> Response:
        pk = self.item_id(notification_id, "Delivery")
        notification_resend(tenant_id=self.tenant_id, notification_id=pk)
        notification = notification_get(tenant_id=self.tenant_id, notification_id=pk)
        return Response(notification_representation(notification, request=request), status=status.HTTP_202_ACCEPTED)
