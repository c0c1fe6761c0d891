"""The REST API of a tenant's connections (docs/connections.md): listed, made, changed (a secret
rotated) and deleted, by name. Thin: execution.connections checks the input and stores it. A
connection's secret is never in an answer, not even the one that stores it; another tenant's
connection answers 404 as one that does not exist."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from eventservice.api.base import TenantApiView
from eventservice.api.schema import TENANT_PARAM, problem_responses
from execution.connections import (
    CLIENT_AUTH,
    MAX_CONNECTIONS,
    Kind,
    connection_create,
    connection_delete,
    connection_get,
    connection_update,
    connection_wire,
    connections_list,
    validate_connection,
)

NAME_PARAM = OpenApiParameter("name", OpenApiTypes.STR, OpenApiParameter.PATH, description="The connection's name.")


class ConnectionSerializer(serializers.Serializer):
    name = serializers.CharField(
        help_text="1-64 letters, digits, '.', '_' or '-'; what `requestSpec.connection` names."
    )
    kind = serializers.ChoiceField(choices=Kind.values)
    username = serializers.CharField(required=False, help_text="`basic`: the user name.")
    headerName = serializers.CharField(required=False, help_text="`apiKeyHeader`: the header each attempt carries.")
    tokenUrl = serializers.URLField(required=False, help_text="`oauth2ClientCredentials`: the token endpoint.")
    clientId = serializers.CharField(required=False, help_text="`oauth2ClientCredentials`: the client id.")
    scope = serializers.CharField(required=False, allow_null=True, help_text="`oauth2ClientCredentials`: scopes.")
    audience = serializers.CharField(
        required=False, allow_null=True, help_text="`oauth2ClientCredentials`: the `audience` asked for, if any."
    )
    clientAuth = serializers.ChoiceField(
        choices=CLIENT_AUTH,
        required=False,
        help_text="`oauth2ClientCredentials`: the client's id and secret sent with HTTP Basic (default) or in the body.",
    )
    createdAt = serializers.DateTimeField(read_only=True)
    updatedAt = serializers.DateTimeField(read_only=True)
    secretUpdatedAt = serializers.DateTimeField(read_only=True, help_text="When the secret was last set.")


class ConnectionInputSerializer(ConnectionSerializer):
    password = serializers.CharField(required=False, write_only=True, help_text="`basic`: the password (secret).")
    headerValue = serializers.CharField(
        required=False, write_only=True, help_text="`apiKeyHeader`: the header's value (secret)."
    )
    clientSecret = serializers.CharField(
        required=False, write_only=True, help_text="`oauth2ClientCredentials`: the client secret (secret)."
    )


class ConnectionListSerializer(serializers.Serializer):
    results = ConnectionSerializer(many=True)


_problems = problem_responses(
    {
        400: "A missing or bad field (`errors` names it), an unknown field for the kind, or a change of name or "
        "kind; nothing is stored.",
        404: "No such tenant, or no connection of that name, for this caller.",
        409: "A connection of that name exists already (create), or live calls or schedules name it (delete: "
        "the answer names them).",
    }
)

_EXAMPLES = [
    OpenApiExample(
        "OAuth2 client credentials",
        value={
            "name": "billing",
            "kind": "oauth2ClientCredentials",
            "tokenUrl": "https://auth.example.com/oauth/token",
            "clientId": "service-agent",
            "clientSecret": "s3cr3t",
            "scope": "invoices:write",
        },
        request_only=True,
    ),
    OpenApiExample(
        "API key header",
        value={"name": "crm", "kind": "apiKeyHeader", "headerName": "X-Api-Key", "headerValue": "k-123"},
        request_only=True,
    ),
    OpenApiExample(
        "Basic", value={"name": "legacy", "kind": "basic", "username": "agent", "password": "pw"}, request_only=True
    ),
]


class ConnectionsApi(TenantApiView):
    @extend_schema(
        operation_id="connections_list",
        summary="List connections",
        description=f"The tenant's connections by name (at most {MAX_CONNECTIONS}), never their secrets.",
        parameters=[TENANT_PARAM],
        responses={200: ConnectionListSerializer, **_problems(401, 404)},
    )
    def get(self, request: Request, tenant_id: str) -> Response:
        return Response({"results": [connection_wire(c) for c in connections_list(tenant_id=self.tenant_id)]})

    @extend_schema(
        operation_id="connections_create",
        summary="Make a connection",
        description=(
            "Named credentials that a call or schedule uses by naming it in `requestSpec.connection`: `basic`, "
            "`apiKeyHeader` or `oauth2ClientCredentials` (the agent fetches a bearer token from `tokenUrl` with "
            "the client-credentials grant, keeps it until shortly before it expires, and fetches it again after a "
            "target's 401). The secret (`password`, `headerValue`, `clientSecret`) is stored sealed and never shown "
            "again, not even in this answer."
        ),
        parameters=[TENANT_PARAM],
        request=ConnectionInputSerializer,
        responses={
            201: OpenApiResponse(ConnectionSerializer, description="Made; `Location` names it."),
            **_problems(400, 401, 403, 404, 409, 413),
        },
        examples=_EXAMPLES,
    )
    def post(self, request: Request, tenant_id: str) -> Response:
        connection = connection_create(tenant_id=self.tenant_id, data=validate_connection(request.data))
        location = request.build_absolute_uri(f"{request.path.rstrip('/')}/{connection.name}")
        return Response(connection_wire(connection), status=status.HTTP_201_CREATED, headers={"Location": location})


class ConnectionDetailApi(TenantApiView):
    @extend_schema(
        operation_id="connections_retrieve",
        summary="Get a connection",
        parameters=[TENANT_PARAM, NAME_PARAM],
        responses={200: ConnectionSerializer, **_problems(401, 404)},
    )
    def get(self, request: Request, tenant_id: str, name: str) -> Response:
        return Response(connection_wire(connection_get(tenant_id=self.tenant_id, name=name)))

    @extend_schema(
        operation_id="connections_update",
        summary="Change a connection or rotate its secret",
        description=(
            "Changes the fields given; giving the secret rotates it. Takes effect for the next attempt of every call "
            "that names the connection (a token fetched before is not used again). The name and the kind stay."
        ),
        parameters=[TENANT_PARAM, NAME_PARAM],
        request=ConnectionInputSerializer,
        responses={200: ConnectionSerializer, **_problems(400, 401, 403, 404, 413)},
        examples=[OpenApiExample("Rotate the client secret", value={"clientSecret": "n3w"}, request_only=True)],
    )
    def patch(self, request: Request, tenant_id: str, name: str) -> Response:
        existing = connection_get(tenant_id=self.tenant_id, name=name)
        data = validate_connection(request.data, existing=existing)
        return Response(connection_wire(connection_update(tenant_id=self.tenant_id, name=name, data=data)))

    @extend_schema(
        operation_id="connections_destroy",
        summary="Delete a connection",
        description="Refused (409, naming them) while Scheduled or Running calls or any schedule name it.",
        parameters=[TENANT_PARAM, NAME_PARAM],
        request=None,
        responses={204: OpenApiResponse(description="Deleted."), **_problems(401, 403, 404, 409)},
    )
    def delete(self, request: Request, tenant_id: str, name: str) -> Response:
        connection_delete(tenant_id=self.tenant_id, name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)
