"""OpenAPI description of the API's authentication (drf-spectacular extension)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant's API key: `Authorization: Bearer <key>` (`manage.py create_api_key`).",
        }


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
    "CreateScheduleRequest",
    "PatchedUpdateScheduleRequest",
)


def closed_request_bodies(result, generator, request, public):
    """drf-spectacular post-processing hook: say `additionalProperties: false` where it holds."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in CLOSED_REQUEST_COMPONENTS:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    return result
