"""The REST API of a tenant's flow control (docs/flow-control.md): its limits, read and
replaced. One view per operation, thin: orchestration.flow checks the input,
orchestration.admission stores it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from core.errors import ValidationFailed
from eventservice.api.base import TenantApiView
from eventservice.api.schema import TENANT_PARAM, problem_responses
from orchestration.admission import flow_control_set, flow_limits_effective, flow_limits_get
from orchestration.flow import MAX_HOSTS, MAX_PARALLELISM, MAX_RATE, MIN_RATE, validate_flow_control
from tenants.selectors import tenant_ceilings_get


class FlowLimitSerializer(serializers.Serializer):
    parallelism = serializers.IntegerField(
        allow_null=True,
        min_value=1,
        max_value=MAX_PARALLELISM,
        help_text="Calls Running at once, at most; null: no limit.",
    )
    ratePerSecond = serializers.FloatField(
        allow_null=True,
        min_value=MIN_RATE,
        max_value=MAX_RATE,
        help_text="Starts per second, at most (spaced evenly: no burst); null: no limit.",
    )


class CeilingsSerializer(serializers.Serializer):
    parallelism = serializers.IntegerField(allow_null=True, help_text="Calls Running at once; null: no ceiling.")
    ratePerSecond = serializers.FloatField(allow_null=True, help_text="Call starts per second; null: no ceiling.")
    subscriptions = serializers.IntegerField(help_text="Subscriptions of the tenant.")
    testPingsPerMinute = serializers.IntegerField(help_text="Test pings (POST .../subscriptions/{id}/test) a minute.")
    submissionsPerSecond = serializers.IntegerField(help_text="Submissions (and reruns) a second per API key.")
    maxAttempts = serializers.IntegerField(help_text="A call's retryPolicy.maxAttempts, at most.")
    minBackoffMs = serializers.IntegerField(help_text="A retrying call's retryPolicy.minBackoffMs, at least.")


class FlowControlSerializer(FlowLimitSerializer):
    hosts = serializers.DictField(
        child=FlowLimitSerializer(),
        help_text=(
            f"Limits per target host (at most {MAX_HOSTS}), each on top of the tenant's: `name`, `name:port`, an "
            "IPv4 address or an [IPv6] literal, as the call's URL names it (a port only when it is not the "
            "scheme's default)."
        ),
    )


def _optional(fields: dict[str, serializers.Field]) -> dict[str, serializers.Field]:
    """A PUT's fields: each may be absent, as null is (no limit)."""
    for name in ("parallelism", "ratePerSecond", "hosts"):
        if name in fields:
            fields[name].required = False
            fields[name].allow_null = True
    return fields


class FlowLimitInputSerializer(FlowLimitSerializer):
    """A host's limits in a PUT: either may be absent (at least one given: the server's rule)."""

    def get_fields(self):
        return _optional(super().get_fields())


class FlowControlInputSerializer(FlowControlSerializer):
    """A PUT: each field may be absent, as null is (no limit); `{}` removes every limit."""

    def get_fields(self):
        fields = _optional(super().get_fields())
        fields["hosts"].child = FlowLimitInputSerializer()
        return fields

    ceilings = serializers.JSONField(
        required=False, help_text="Ignored: GET's read-only part, which a PUT may carry back."
    )
    effective = serializers.JSONField(required=False, help_text="Ignored, as `ceilings`.")


class FlowControlOutputSerializer(FlowControlSerializer):
    ceilings = CeilingsSerializer(
        read_only=True,
        help_text="The operator's ceilings for this tenant (read-only; ignored in a PUT): the tenant's own limits "
        "stay at or below them.",
    )
    effective = FlowLimitSerializer(
        read_only=True, help_text="The tenant's limits in force: its own, or the ceiling where that is lower."
    )


EXAMPLE = OpenApiExample(
    "A tenant limit and a slower host",
    value={
        "parallelism": 20,
        "ratePerSecond": 50,
        "hosts": {"api.example.com": {"parallelism": 2, "ratePerSecond": 5}},
    },
)


_problems = problem_responses(
    {
        400: "Invalid limits, no body, or a limit above the operator's ceiling (`errors` names the fields); "
        "nothing is stored.",
        404: "No such tenant for this caller.",
    }
)


class FlowControlGetApi(TenantApiView):
    @extend_schema(
        operation_id="flow_control_retrieve",
        summary="Get the tenant's flow-control limits",
        parameters=[TENANT_PARAM],
        responses={200: FlowControlOutputSerializer, **_problems(401, 404)},
        examples=[EXAMPLE],
    )
    def get(self, request: Request, tenant_id: str) -> Response:
        return Response(flow_control_wire(self.tenant_id))


class FlowControlPutApi(TenantApiView):
    @extend_schema(
        operation_id="flow_control_update",
        summary="Replace the tenant's flow-control limits",
        description=(
            "Replaces the tenant's own limits: a field absent or null means no limit of its own, and `{}` removes "
            "them all; the operator's ceilings (`ceilings`, read-only) stay, and a limit above one is a 400 naming "
            "the field. A request without a body is a 400 and changes nothing. Calls over "
            "a limit are never refused: they wait, held, and start in due order as soon as there is room "
            "(their `heldMs` says for how long). The limits hold across every worker cluster. A limit set on a "
            "tenant that had none applies within about a second."
        ),
        parameters=[TENANT_PARAM],
        request=FlowControlInputSerializer,
        responses={200: FlowControlOutputSerializer, **_problems(400, 401, 403, 404, 413)},
        examples=[EXAMPLE],
    )
    def put(self, request: Request, tenant_id: str) -> Response:
        if not request._request.body.strip():
            # Not "no limits": `{}` says that; an empty request is a client's mistake.
            raise ValidationFailed(
                {"body": ["A JSON object is required: {parallelism, ratePerSecond, hosts}; {} removes your limits."]}
            )
        data = request.data
        if isinstance(data, dict):
            data = {key: value for key, value in data.items() if key not in READ_ONLY}
        flow_control_set(tenant_id=self.tenant_id, limits=validate_flow_control(data))
        return Response(flow_control_wire(self.tenant_id))


# What GET adds to the limits: a client may PUT back what it read.
READ_ONLY = ("ceilings", "effective")


def flow_control_wire(tenant_id: str) -> dict[str, Any]:
    """The tenant's own limits, the operator's ceilings, and the limits in force."""
    return {
        **flow_limits_get(tenant_id=tenant_id).as_wire(),
        "ceilings": tenant_ceilings_get(tenant_id=tenant_id).as_wire(),
        "effective": flow_limits_effective(tenant_id=tenant_id).tenant.as_wire(),
    }


class FlowControlApi(FlowControlGetApi, FlowControlPutApi):
    """The flow-control path: GET is FlowControlGetApi.get, PUT is FlowControlPutApi.put."""
