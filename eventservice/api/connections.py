"""The REST API of a tenant's connections (docs/connections.md): listed, made, changed (a secret
rotated) and deleted, by name. Thin: execution.connections checks the input and stores it. A
connection's secret is never in an answer, not even the one that stores it; another tenant's
connection answers 404 as one that does not exist."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from core.text import CONTROL_CLASS, visible_pattern
from eventservice.api.base import TenantApiView
from eventservice.api.schema import TENANT_PARAM, HttpUrlField, problem_responses
from execution.connections import (
    CLIENT_AUTH,
    MAX_CONNECTIONS,
    MAX_SECRET,
    MAX_TEXT,
    NAME_PATTERN,
    NAME_RULE,
    SECRET,
    SHOWN,
    Kind,
    connection_create,
    connection_delete,
    connection_get,
    connection_update,
    connection_wire,
    connections_list,
    validate_connection,
)
from execution.targets import HEADER_NAME_PATTERN, HEADER_VALUE_PATTERN

NAME_PARAM = OpenApiParameter("name", OpenApiTypes.STR, OpenApiParameter.PATH, description="The connection's name.")


# Each field a connection may be given, with execution.connections' rules as patterns where a
# pattern can say them (which header names are credentials and unpaired surrogates
# stay the server's to check), each made by a function of whether it is required.
_USERNAME = visible_pattern(also_refused=":")
_SECRET = rf"^[^{CONTROL_CLASS}]+$"
_FIELDS = {
    "username": lambda required: serializers.RegexField(
        _USERNAME, max_length=MAX_TEXT, required=required, help_text="`basic`: the user name (no ':')."
    ),
    "password": lambda required: serializers.RegexField(
        _SECRET, max_length=MAX_SECRET, required=required, write_only=True, help_text="`basic`: the password (secret)."
    ),
    "headerName": lambda required: serializers.RegexField(
        HEADER_NAME_PATTERN, required=required, help_text="`apiKeyHeader`: the header each attempt carries."
    ),
    "headerValue": lambda required: serializers.RegexField(
        HEADER_VALUE_PATTERN,
        min_length=1,
        max_length=MAX_SECRET,
        required=required,
        write_only=True,
        help_text="`apiKeyHeader`: the header's value (secret).",
    ),
    "tokenUrl": lambda required: HttpUrlField(
        required=required, help_text="`oauth2ClientCredentials`: the token endpoint."
    ),
    "clientId": lambda required: serializers.RegexField(
        visible_pattern(), max_length=MAX_TEXT, required=required, help_text="`oauth2ClientCredentials`: the client id."
    ),
    "clientSecret": lambda required: serializers.RegexField(
        _SECRET,
        max_length=MAX_SECRET,
        required=required,
        write_only=True,
        help_text="`oauth2ClientCredentials`: the client secret (secret).",
    ),
    "scope": lambda required: serializers.RegexField(
        rf"^(?=[\s\S]*\S)[^{CONTROL_CLASS}]+$",
        max_length=1024,
        required=required,
        allow_null=True,
        help_text="`oauth2ClientCredentials`: scopes, separated by spaces.",
    ),
    "audience": lambda required: serializers.RegexField(
        visible_pattern(),
        max_length=2048,
        required=required,
        allow_null=True,
        help_text="`oauth2ClientCredentials`: the `audience` asked for, if any.",
    ),
    "clientAuth": lambda required: serializers.ChoiceField(
        choices=CLIENT_AUTH,
        required=required,
        help_text="`oauth2ClientCredentials`: the client's id and secret sent with HTTP Basic (default) or in the body.",
    ),
}
_NAME_HELP = f"{NAME_RULE}; what `requestSpec.connection` names."


def _serializer(name: str, doc: str, fields: dict[str, serializers.Field]) -> type[serializers.Serializer]:
    return type(name, (serializers.Serializer,), {"__doc__": doc, "__module__": __name__, **fields})


def _name_and_kind(*kinds: str, required: bool = True) -> dict[str, serializers.Field]:
    return {
        "name": serializers.RegexField(NAME_PATTERN, required=required, help_text=_NAME_HELP),
        "kind": serializers.ChoiceField(choices=list(kinds), required=required),
    }


ConnectionSerializer = _serializer(
    "ConnectionSerializer",
    "A connection as the API shows it: every field but its secret.",
    {
        **_name_and_kind(*Kind.values),
        **{field: make(False) for field, make in _FIELDS.items() if field not in SECRET.values()},
        "createdAt": serializers.DateTimeField(read_only=True),
        "updatedAt": serializers.DateTimeField(read_only=True),
        "secretUpdatedAt": serializers.DateTimeField(read_only=True, help_text="When the secret was last set."),
    },
)
ConnectionChangeSerializer = _serializer(
    "ConnectionChangeSerializer",
    "A PATCH: any field of the connection's kind; its secret rotates it. The name and kind stay (given, they "
    "must be the connection's).",
    {**_name_and_kind(*Kind.values, required=False), **{field: make(False) for field, make in _FIELDS.items()}},
)


def _input_of(kind: str) -> type[serializers.Serializer]:
    """What makes a connection of `kind`: its required fields and secret, its optional fields."""
    required, optional = SHOWN[kind]
    return _serializer(
        f"{kind[0].upper()}{kind[1:]}ConnectionInputSerializer",
        f"A `{kind}` connection to make.",
        {
            **_name_and_kind(kind),
            **{field: _FIELDS[field](True) for field in (*required, SECRET[kind])},
            **{field: _FIELDS[field](False) for field in optional},
        },
    )


CONNECTION_INPUT = PolymorphicProxySerializer(
    component_name="ConnectionInput",
    serializers={kind: _input_of(kind) for kind in Kind.values},
    resource_type_field_name="kind",
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
        request=CONNECTION_INPUT,
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
        request=ConnectionChangeSerializer,
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
