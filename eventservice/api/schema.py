"""What the OpenAPI document shares across the API's modules: the authentication scheme
(drf-spectacular extension), the tenant and paging parameters, the problem+json answers, and
the request bodies that refuse unknown fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers

from eventservice.api.base import DEFAULT_LIMIT, MAX_LIMIT
from eventservice.api.errors import PROBLEM_CONTENT_TYPE
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
    "CreateScheduleRequest",
    "PatchedUpdateScheduleRequest",
    "ConnectionInputRequest",
    "BackfillInputRequest",
    "FlowControlInputRequest",
    "FlowLimitRequest",
)


def closed_request_bodies(result, generator, request, public):
    """drf-spectacular post-processing hook: say `additionalProperties: false` where it holds."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in CLOSED_REQUEST_COMPONENTS:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    return result
