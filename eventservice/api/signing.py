"""The REST API of a tenant's signed calls (docs/api.md, "Signed calls"): read, and turned on, off
or rotated. Thin: execution.signing checks the input and stores it."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from core.errors import ValidationFailed
from eventservice.api.base import TenantApiView
from eventservice.api.schema import TENANT_PARAM, problem_responses
from eventservice.api.subscriptions import SECRET_HEADERS
from execution.signing import call_signing_get, call_signing_set, validate_signing


class SigningInputSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="Whether each attempt of the tenant's calls is signed.")
    rotateSecret = serializers.BooleanField(
        required=False,
        help_text="Make a new secret (shown once in the answer); the previous one signs beside it for 24 hours.",
    )


class SigningSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    secretCreatedAt = serializers.DateTimeField(allow_null=True, help_text="When the current secret was made.")
    previousSecretSignsUntil = serializers.DateTimeField(
        allow_null=True, help_text="After a rotation: until when the previous secret signs too; null otherwise."
    )
    secret = serializers.CharField(
        required=False,
        help_text="`whsec_...`, only in the answer that made it (the first enabling, a rotation): keep it now, "
        "it is never shown again.",
    )


_problems = problem_responses(
    {
        400: "No body, a field that is not a boolean, an unknown field, or a rotation while disabled (`errors` names "
        "the fields); nothing is stored.",
        404: "No such tenant for this caller.",
    }
)


class SigningApi(TenantApiView):
    @extend_schema(
        operation_id="signing_retrieve",
        summary="Get whether the tenant's calls are signed",
        parameters=[TENANT_PARAM],
        responses={200: SigningSerializer, **_problems(401, 404)},
    )
    def get(self, request: Request, tenant_id: str) -> Response:
        return Response(call_signing_get(tenant_id=self.tenant_id).as_wire())

    @extend_schema(
        operation_id="signing_update",
        summary="Sign the tenant's calls, stop, or rotate the secret",
        description=(
            "With signing enabled, each attempt of the tenant's calls carries Standard Webhooks headers: "
            "`webhook-id` (`<serviceCallId>.<attempt>`), `webhook-timestamp` and `webhook-signature` over "
            "`id.timestamp.body`, so the target verifies them with its language's `standardwebhooks` package. The "
            "first enabling answers the secret (`whsec_...`) once; enabling again after a disabling signs with the "
            "same secret. `rotateSecret: true` makes a new one, answered once, and the previous one signs beside it "
            "for 24 hours. Takes effect for attempts that start a second later at most."
        ),
        parameters=[TENANT_PARAM],
        request=SigningInputSerializer,
        responses={200: SigningSerializer, **_problems(400, 401, 404, 413)},
        examples=[
            OpenApiExample("Sign every call", value={"enabled": True}, request_only=True),
            OpenApiExample("Rotate the secret", value={"enabled": True, "rotateSecret": True}, request_only=True),
        ],
    )
    def put(self, request: Request, tenant_id: str) -> Response:
        if not request._request.body.strip():
            raise ValidationFailed({"body": ['A JSON object is required: {"enabled": true|false}.']})
        enabled, rotate = validate_signing(request.data)
        state, secret = call_signing_set(tenant_id=self.tenant_id, enabled=enabled, rotate=rotate)
        if secret is None:
            return Response(state.as_wire())
        # The answer that shows a secret is kept by no cache (docs/security.md, "Secrets shown once").
        return Response(state.as_wire() | {"secret": secret}, headers=SECRET_HEADERS)
