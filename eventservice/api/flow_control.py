"""The REST API of a tenant's flow control (docs/flow-control.md): its limits, read and
replaced. One view per operation, thin: orchestration.flow checks the input,
orchestration.admission stores it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from eventservice.api import serializers as s
from eventservice.api.base import TenantApiView
from eventservice.api.errors import PROBLEM_CONTENT_TYPE
from eventservice.api.views import TENANT_PARAM
from orchestration.admission import flow_control_set, flow_limits_get
from orchestration.flow import MAX_HOSTS, MAX_PARALLELISM, MAX_RATE, MIN_RATE, validate_flow_control


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


class FlowControlSerializer(FlowLimitSerializer):
    hosts = serializers.DictField(
        child=FlowLimitSerializer(),
        help_text=(
            f"Limits per target host (at most {MAX_HOSTS}), each on top of the tenant's: `name`, `name:port`, an "
            "IPv4 address or an [IPv6] literal, as the call's URL names it (a port only when it is not the "
            "scheme's default)."
        ),
    )


EXAMPLE = OpenApiExample(
    "A tenant limit and a slower host",
    value={
        "parallelism": 20,
        "ratePerSecond": 50,
        "hosts": {"api.example.com": {"parallelism": 2, "ratePerSecond": 5}},
    },
)


def _problems(*codes: int) -> dict[Any, OpenApiResponse]:
    descriptions = {
        400: "Invalid limits (`errors` names the fields); nothing is stored.",
        401: "No or unknown credentials.",
        403: "CSRF check failed (browser sessions).",
        404: "No such tenant for this caller.",
        413: "Request body too large.",
    }
    return {
        (code, PROBLEM_CONTENT_TYPE): OpenApiResponse(s.ProblemSerializer, description=descriptions[code])
        for code in codes
    }


class FlowControlGetApi(TenantApiView):
    @extend_schema(
        operation_id="flow_control_retrieve",
        summary="Get the tenant's flow-control limits",
        parameters=[TENANT_PARAM],
        responses={200: FlowControlSerializer, **_problems(401, 404)},
        examples=[EXAMPLE],
    )
    def get(self, request: Request, tenant_id: str) -> Response:
        return Response(flow_limits_get(tenant_id=self.tenant_id).as_wire())


class FlowControlPutApi(TenantApiView):
    @extend_schema(
        operation_id="flow_control_update",
        summary="Replace the tenant's flow-control limits",
        description=(
            "Replaces every limit: a field absent or null means no limit, and `{}` removes them all. Calls over "
            "a limit are never refused: they wait, held, and start in due order as soon as there is room "
            "(their `heldMs` says for how long). The limits hold across every worker cluster. A limit set on a "
            "tenant that had none applies within about a second."
        ),
        parameters=[TENANT_PARAM],
        request=FlowControlSerializer,
        responses={200: FlowControlSerializer, **_problems(400, 401, 403, 404, 413)},
        examples=[EXAMPLE],
    )
    def put(self, request: Request, tenant_id: str) -> Response:
        limits = validate_flow_control(request.data)
        return Response(flow_control_set(tenant_id=self.tenant_id, limits=limits).as_wire())


class FlowControlApi(FlowControlGetApi, FlowControlPutApi):
    """The flow-control path: GET is FlowControlGetApi.get, PUT is FlowControlPutApi.put."""
