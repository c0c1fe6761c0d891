"""The REST API of a tenant's recurring schedules (docs/schedules.md): one view per
operation, thin.

Input is checked by schedules.validation, state changes go through schedules.services, reads
through schedules.selectors, and output through schedules.representation. Another tenant's
schedule answers 404, as one that does not exist.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from core.ids import iso_ms, utcnow
from eventservice.api import schedule_serializers as ss
from eventservice.api.base import TenantApiView, TenantCollectionApi
from eventservice.api.schema import PAGING_PARAMS, TENANT_PARAM, problem_responses
from eventservice.api.throttles import submissions_charge
from schedules.cron import DST_REPEATED, DST_SKIPPED, dst_preview, next_occurrences
from schedules.models import Schedule
from schedules.representation import (
    NEXT_RUNS,
    run_representation,
    schedule_detail_representation,
    schedule_representation,
)
from schedules.selectors import schedule_calls, schedule_get, schedules_for_tenant
from schedules.services import backfill_plan, schedule_backfill, schedule_create, schedule_delete, schedule_update
from schedules.validation import validate_backfill, validate_preview, validate_schedule

SCHEDULE_PARAM = OpenApiParameter("schedule_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
_problems = problem_responses(
    {
        400: "Invalid input (`errors` names the fields); nothing is stored.",
        404: "No such tenant or schedule for this caller.",
        429: "Past the tenant's submissions ceiling (`Retry-After` says when to try again).",
    }
)


def _detail(request: Request, schedule: Schedule) -> dict[str, Any]:
    return schedule_detail_representation(schedule, calls=schedule_calls(schedule=schedule), request=request)


class ScheduleListApi(TenantCollectionApi):
    """GET the tenant's schedules, newest first, cursor-paginated."""

    @extend_schema(
        operation_id="schedules_list",
        summary="List schedules",
        description="The tenant's recurring schedules with their next run, newest first, with cursor pagination.",
        parameters=[TENANT_PARAM, *PAGING_PARAMS],
        responses={200: ss.SchedulePageSerializer, **_problems(400, 401, 404)},
    )
    def get(self, request: Request, tenant_id: str) -> Response:
        page = self.page_of(schedules_for_tenant(tenant_id=self.tenant_id))
        now = utcnow()
        return self.page_response(page, lambda row: schedule_representation(row, request=request, now=now))


class ScheduleCreateApi(TenantCollectionApi):
    """POST a schedule: 201 with it, its next runs and the first call, already made ahead."""

    @extend_schema(
        operation_id="schedules_create",
        summary="Create a recurring schedule",
        description=(
            "Each occurrence of `cron` in `timezone` becomes one service call with this request, tags and "
            "retry policy, made ahead as `Scheduled` (the answer shows the first one in `recentCalls`). "
            "Paused: no call until resumed."
        ),
        parameters=[TENANT_PARAM],
        request=ss.CreateScheduleSerializer,
        responses={
            201: OpenApiResponse(ss.ScheduleDetailSerializer, description="Created; `Location` names it."),
            **_problems(400, 401, 403, 404, 413),
        },
    )
    def post(self, request: Request, tenant_id: str) -> Response:
        data = validate_schedule(request.data)
        schedule = schedule_create(tenant_id=self.tenant_id, data=data, correlation_id=request.correlation_id)
        body = _detail(request, schedule)
        return Response(body, status=status.HTTP_201_CREATED, headers={"Location": body["links"]["self"]})


class SchedulesApi(ScheduleListApi, ScheduleCreateApi):
    """The collection path: GET is ScheduleListApi.get, POST is ScheduleCreateApi.post."""


class SchedulePreviewApi(TenantApiView):
    @extend_schema(
        operation_id="schedules_preview",
        summary="Preview a cron's next runs",
        description=(
            "The next five occurrences of `cron` in `timezone` from now, each in UTC and in the zone "
            "(what a schedule with them would run), or 400 saying why the cron or zone is refused. "
            "Nothing is stored."
        ),
        parameters=[
            TENANT_PARAM,
            OpenApiParameter("cron", str, required=True, description=ss.CRON_HELP),
            OpenApiParameter("timezone", str, description=ss.ZONE_HELP),
            OpenApiParameter("dstSkipped", str, enum=DST_SKIPPED, description="The spring-forward choice."),
            OpenApiParameter("dstRepeated", str, enum=DST_REPEATED, description="The fall-back choice."),
        ],
        responses={200: ss.PreviewSerializer, **_problems(400, 401, 404)},
    )
    def get(self, request: Request, tenant_id: str) -> Response:
        query = request.query_params
        cron, zone, choices = validate_preview(
            query.get("cron"), query.get("timezone"), query.get("dstSkipped"), query.get("dstRepeated")
        )
        now = utcnow()
        runs = next_occurrences(cron, zone, after=now, count=NEXT_RUNS, **choices)
        return Response(
            {
                "cron": cron,
                "timezone": zone,
                "nextRuns": [run_representation(at, zone) for at in runs],
                "nextDstTransition": dst_preview(cron, zone, after=now),
            }
        )


class ScheduleGetApi(TenantCollectionApi):
    @extend_schema(
        operation_id="schedules_retrieve",
        summary="Get a schedule with its next runs and recent calls",
        parameters=[TENANT_PARAM, SCHEDULE_PARAM],
        responses={200: ss.ScheduleDetailSerializer, **_problems(401, 404)},
    )
    def get(self, request: Request, tenant_id: str, schedule_id: str) -> Response:
        return Response(_detail(request, schedule_get(tenant_id=self.tenant_id, schedule_id=schedule_id)))


class ScheduleUpdateApi(TenantCollectionApi):
    @extend_schema(
        operation_id="schedules_update",
        summary="Change, pause or resume a schedule",
        description=(
            "Changes the fields given. `paused: true` cancels the call made ahead and makes no more; "
            "`paused: false` resumes from now. A new cron, zone, start, end, request, tags or retry policy "
            "plans the schedule from now again: the call made ahead is cancelled and the next one made. "
            "A new name shows on the calls made after the change."
        ),
        parameters=[TENANT_PARAM, SCHEDULE_PARAM],
        request=ss.UpdateScheduleSerializer,
        responses={200: ss.ScheduleDetailSerializer, **_problems(400, 401, 403, 404, 413)},
    )
    def patch(self, request: Request, tenant_id: str, schedule_id: str) -> Response:
        schedule = schedule_get(tenant_id=self.tenant_id, schedule_id=schedule_id)
        data = validate_schedule(request.data, partial=True)
        schedule = schedule_update(
            tenant_id=self.tenant_id,
            schedule_id=schedule.schedule_id,
            data=data,
            correlation_id=request.correlation_id,
        )
        return Response(_detail(request, schedule))


class ScheduleDeleteApi(TenantCollectionApi):
    @extend_schema(
        operation_id="schedules_destroy",
        summary="Delete a schedule",
        description="No occurrence follows (the call made ahead is cancelled); the calls it made stay.",
        parameters=[TENANT_PARAM, SCHEDULE_PARAM],
        request=None,
        responses={204: OpenApiResponse(description="Deleted."), **_problems(401, 403, 404)},
    )
    def delete(self, request: Request, tenant_id: str, schedule_id: str) -> Response:
        schedule = schedule_get(tenant_id=self.tenant_id, schedule_id=schedule_id)
        schedule_delete(
            tenant_id=self.tenant_id, schedule_id=schedule.schedule_id, correlation_id=request.correlation_id
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class ScheduleBackfillApi(TenantCollectionApi):
    @extend_schema(
        operation_id="schedules_backfill",
        summary="Run a past range of a schedule's occurrences",
        description=(
            "One call for each occurrence of the cron in `[from, to]` (`to` not in the future) that has no live call: "
            "one never made, skipped (the catch-up window) or cancelled gets a call due at once, run in occurrence "
            "order under the schedule's overlap policy (or `overlap`, for this backfill); one that has its call keeps "
            "it, so asking again makes nothing twice. At most 1,000 occurrences (more: 400 naming `to`, nothing "
            "made). Each occurrence of the range counts against the submissions ceiling."
        ),
        parameters=[TENANT_PARAM, SCHEDULE_PARAM],
        request=ss.BackfillInputSerializer,
        responses={200: ss.BackfillSerializer, **_problems(400, 401, 403, 404, 413, 429)},
    )
    def post(self, request: Request, tenant_id: str, schedule_id: str) -> Response:
        start, end, overlap = validate_backfill(request.data)
        instants = backfill_plan(tenant_id=self.tenant_id, schedule_id=schedule_id, start=start, end=end)
        submissions_charge(request, self, len(instants))
        done = schedule_backfill(tenant_id=self.tenant_id, schedule_id=schedule_id, instants=instants, overlap=overlap)
        calls = sorted([*done.made, *done.existing], key=lambda call: call.occurrence_at)
        made = {call.pk for call in done.made}
        return Response(
            {
                "made": len(done.made),
                "alreadyMade": len(done.existing),
                "calls": [
                    {
                        "serviceCallId": str(call.pk),
                        "occurrenceAt": iso_ms(call.occurrence_at),
                        "status": call.status,
                        "made": call.pk in made,
                    }
                    for call in calls
                ],
            }
        )


class ScheduleDetailApi(ScheduleGetApi, ScheduleUpdateApi, ScheduleDeleteApi):
    """The schedule's path: GET, PATCH and DELETE, one view class each."""
