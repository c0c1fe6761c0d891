"""What the OpenAPI document shares across the API's modules: the authentication scheme
(drf-spectacular extension), the tenant and paging parameters, the problem+json answers, and
the request bodies that refuse unknown fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_field
from rest_framework import serializers

from eventservice.api.base import DEFAULT_LIMIT, MAX_LIMIT
from eventservice.api.errors import PROBLEM_CONTENT_TYPE
from execution.targets import http_url_pattern
from tenants.models import TENANT_SLUG_PATTERN


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant's API key: `Authorization: Bearer <key>` (`manage.py create_api_key`).",
        }


@extend_schema_field({"type": "string", "pattern": http_url_pattern()})
class HttpUrlField(serializers.CharField):
    """An http or https URL, with url_error's rules of form as the schema's pattern. Not `format:
    uri`: RFC 3986 refuses what the server takes and stores (https://bücher.example/café, `|`,
    `{}`), and `uri` alone admits any scheme ("api:calls") the server refuses."""


TENANT_PARAM = OpenApiParameter(
    "tenant_id",
    {"type": "string", "pattern": TENANT_SLUG_PATTERN},
    OpenApiParameter.PATH,
    description="Tenant id (slug).",
)
# A collection's page (eventservice.api.base.paging_params).
PAGING_PARAMS = [
    OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}),
    OpenApiParameter(
        "cursor",
        {"type": "string", "pattern": r"^[A-Za-z0-9_-]*$"},
        description="Opaque; from a `next` or `previous` link.",
    ),
]


class ProblemSerializer(serializers.Serializer):
    """RFC 7807 problem details."""

    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    correlationId = serializers.CharField()
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="For invalid input: wire field name to messages.",
    )


# What a problem answer means wherever the API gives it; a module words the rest (its 404 names
# what was not found).
PROBLEMS = {
    400: "Invalid input (`errors` names the fields).",
    401: "No or unknown credentials.",
    403: "CSRF check failed (browser sessions).",
    413: "Request body too large.",
}


def problem_responses(descriptions: dict[int, str]) -> Callable[..., dict[Any, OpenApiResponse]]:
    """A module's `_problems(400, 404, ...)`: the problem+json answers of those codes, each
    described in the module's words, else in the shared ones (PROBLEMS)."""
    described = {**PROBLEMS, **descriptions}

    def problems(*codes: int) -> dict[Any, OpenApiResponse]:
        return {
            (code, PROBLEM_CONTENT_TYPE): OpenApiResponse(ProblemSerializer, description=described[code])
            for code in codes
        }

    return problems


# Request bodies the API refuses unknown fields in (orchestration.validation, the tags view,
# delivery.validation, the recover view, the rerun).
CLOSED_REQUEST_COMPONENTS = (
    "SubmitServiceCallRequest",
    "RequestSpecRequest",
    "TagsInputRequest",
    "RerunInputRequest",
    "CreateSubscriptionRequest",
    "PatchedUpdateSubscriptionRequest",
    "RecoverInputRequest",
    "SigningInputRequest",
    "BatchInputRequest",
    "BulkInputRequest",
    "BulkFilterRequest",
    "CreateScheduleRequest",
    "PatchedUpdateScheduleRequest",
    "BasicConnectionInputRequest",
    "ApiKeyHeaderConnectionInputRequest",
    "Oauth2ClientCredentialsConnectionInputRequest",
    "PatchedConnectionChangeRequest",
    "BackfillInputRequest",
    "RetryPolicyRequest",
    "FlowControlInputRequest",
    "FlowLimitInputRequest",
)


# Request bodies that take exactly one of some fields (schedules.validation: a cron or an interval).
ONE_OF_REQUIRED = {"CreateScheduleRequest": ("cron", "every")}
# Operations whose body is required though drf-spectacular cannot tell (one of several kinds; a
# body whose every field is optional).
BODY_REQUIRED = ("connections_create", "flow_control_update")


def closed_request_bodies(result, generator, request, public):
    """drf-spectacular post-processing hook: say `additionalProperties: false` where it holds,
    which fields exclude each other, and which bodies are required."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in CLOSED_REQUEST_COMPONENTS:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    for name, fields in ONE_OF_REQUIRED.items():
        if name in schemas:
            schemas[name]["oneOf"] = [{"required": [field]} for field in fields]
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict) and operation.get("operationId") in BODY_REQUIRED:
                operation["requestBody"]["required"] = True
    return result


# The API's resources in the order a reader meets them (docs/api.md): each operation is tagged by
# the path's segment after the tenant, and the paths are listed in this order.
RESOURCES = (
    ("Service calls", ("service-calls",), "Submit a call (now or at a time), follow it, cancel it, run it again, "
     "tag it; batches of calls and bulk actions on what a filter matches."),
    ("Schedules", ("schedules",), "Recurring schedules: a cron or an interval in a time zone, one call per "
     "occurrence, with overlap, catch-up, backfill, jitter and DST policies."),
    ("Subscriptions", ("subscriptions", "deliveries"), "Where the events of calls go: webhooks signed with "
     "Standard Webhooks (and NATS for operators), each delivery and its attempts."),
    ("Events", ("events",), "The events feed: every state change of the tenant's calls and schedules, in order."),
    ("Flow control", ("flow-control",), "The tenant's limits: calls at once and starts per second, per host too."),
    ("Connections", ("connections",), "Credentials calls carry without holding them: basic, an API key header, "
     "OAuth2 client credentials."),
    ("Signing", ("signing",), "Signing outgoing calls with a tenant key (Standard Webhooks)."),
)  # fmt: skip
DESCRIPTION = (
    "Define outgoing HTTP service calls, run them now, at a chosen time or on a schedule, and receive every "
    "state change as an event. Resources, in the order a client meets them: service calls, schedules, "
    "subscriptions and their deliveries, the events feed, flow control, connections and signing. The rules "
    "every operation follows (camelCase, problem+json, tenants, pagination) are in docs/api.md."
)

# OpenAPI links (what a client or a stateful fuzzer may call next with a response's id):
# operation -> {status: {name: (operationId, {parameter: expression})}}.
_TENANT = {"tenant_id": "$request.path.tenant_id"}
_CALL = {**_TENANT, "service_call_id": "$response.body#/serviceCallId"}
_CALL_LINKS = {
    "GetCall": ("service_calls_retrieve", _CALL),
    "CancelCall": ("service_calls_cancel", _CALL),
    "RerunCall": ("service_calls_rerun", _CALL),
    "SetCallTags": ("service_calls_tags_set", _CALL),
}
_SUBSCRIPTION = {**_TENANT, "subscription_id": "$response.body#/subscriptionId"}
_SCHEDULE = {**_TENANT, "schedule_id": "$response.body#/scheduleId"}
_SCHEDULE_CALLS = ("service_calls_list", {**_TENANT, "scheduleId": "$response.body#/scheduleId"})
LINKS = {
    "service_calls_submit": {"202": _CALL_LINKS, "200": _CALL_LINKS},
    "service_calls_rerun": {"202": _CALL_LINKS},
    "service_calls_retrieve": {"200": {k: v for k, v in _CALL_LINKS.items() if k != "GetCall"}},
    "subscriptions_create": {
        "201": {
            "GetSubscription": ("subscriptions_retrieve", _SUBSCRIPTION),
            "ListDeliveries": ("subscriptions_deliveries", _SUBSCRIPTION),
            "SendTestEvent": ("subscriptions_send_test", _SUBSCRIPTION),
        }
    },
    "subscriptions_retrieve": {"200": {"ListDeliveries": ("subscriptions_deliveries", _SUBSCRIPTION)}},
    "schedules_create": {"201": {"GetSchedule": ("schedules_retrieve", _SCHEDULE), "ListItsCalls": _SCHEDULE_CALLS}},
    "schedules_retrieve": {"200": {"ListItsCalls": _SCHEDULE_CALLS}},
    "connections_create": {
        "201": {"GetConnection": ("connections_retrieve", {**_TENANT, "name": "$response.body#/name"})}
    },
}


def resources_and_links(result, generator, request, public):
    """drf-spectacular post-processing hook: operations tagged by resource, in the order of
    RESOURCES, with the API's description and the OpenAPI links of LINKS."""
    order = {segment: index for index, (_, segments, _) in enumerate(RESOURCES) for segment in segments}
    names = {segment: name for name, segments, _ in RESOURCES for segment in segments}

    def segment(path: str) -> str:
        parts = path.strip("/").split("/")
        return parts[3] if len(parts) > 3 and parts[:2] == ["api", "tenants"] else ""

    paths = result.get("paths", {})
    result["paths"] = dict(sorted(paths.items(), key=lambda item: order.get(segment(item[0]), len(RESOURCES))))
    for path, operations in result["paths"].items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "operationId" not in operation:
                continue
            if segment(path) in names:
                operation["tags"] = [names[segment(path)]]
            for status, links in LINKS.get(operation["operationId"], {}).items():
                response = operation.get("responses", {}).get(status)
                if response is not None:
                    response["links"] = {
                        name: {"operationId": target, "parameters": dict(parameters)}
                        for name, (target, parameters) in links.items()
                    }
    result["tags"] = [{"name": name, "description": text} for name, _, text in RESOURCES]
    result.setdefault("info", {})["description"] = DESCRIPTION
    return result
