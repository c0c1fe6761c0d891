"""The REST API of service calls (docs/api.md): one view per operation, thin.

Input is checked by orchestration.validation, state changes go through
orchestration.services, reads through selectors, and output through
orchestration.representation.
"""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from core.errors import ValidationFailed
from eventservice.api import service_call_serializers as s
from eventservice.api.base import TenantApiView, TenantCollectionApi, keyset_page, paging_params, parse_limit
from eventservice.api.errors import PROBLEM_CONTENT_TYPE, problem_body
from eventservice.api.parsers import JSONParser
from eventservice.api.schema import PAGING_PARAMS, TENANT_PARAM, ProblemSerializer, problem_responses
from eventservice.api.throttles import CountedSubmissionThrottle, SubmissionThrottle, submissions_charge
from eventservice.representation import service_call_detail_representation
from execution.selectors import attempts_for_call
from orchestration.filters import ServiceCallFilter, filter_errors
from orchestration.many import validate_batch, validate_bulk
from orchestration.models import ServiceCall
from orchestration.representation import event_representation, service_call_representation
from orchestration.selectors import service_call_get, service_calls_for_tenant
from orchestration.services import (
    BATCH_MAX,
    BULK_MAX,
    BatchResult,
    bulk_calls_matched,
    service_call_cancel,
    service_call_rerun,
    service_call_submit,
    service_call_tags_set,
    service_calls_bulk,
    service_calls_submit_batch,
)
from orchestration.validation import Submission, past_due_warning, validate_rerun, validate_submission
from outbox.models import OutboxEvent
from outbox.selectors import FeedPositionAhead, events_feed, events_for_call, feed_seq_of_event

_problems = problem_responses(
    {
        404: "No such tenant or call for this caller.",
        409: "Idempotency key reused with a different payload.",
        429: "Past the tenant's submissions ceiling (`Retry-After` says when to try again).",
    }
)
CALL_PARAM = OpenApiParameter("service_call_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


def _call(request: Request, tenant_id: str, service_call_id: Any) -> dict[str, Any]:
    call = service_call_get(tenant_id=tenant_id, service_call_id=service_call_id)
    return service_call_representation(call, request=request)


class ServiceCallBaseApi(TenantCollectionApi):
    """The base of the views of the tenant's calls."""

    item_name = "Service call"


class ServiceCallListApi(ServiceCallBaseApi):
    """GET the tenant's calls, newest submitted first, filtered, cursor-paginated."""

    @extend_schema(
        operation_id="service_calls_list",
        summary="List service calls",
        description="The tenant's calls, newest submitted first, filtered, with cursor pagination.",
        parameters=[
            TENANT_PARAM,
            OpenApiParameter(
                "status",
                str,
                many=True,
                enum=ServiceCall.Status.values,
                description="Repeatable: any of these statuses.",
            ),
            OpenApiParameter(
                "tag",
                {
                    "type": "array",
                    "maxItems": 20,
                    "items": {"type": "string", "pattern": s.TAG_PATTERN, "maxLength": 64},
                },
                style="form",
                explode=True,
                description="Repeatable: all of these tags.",
            ),
            OpenApiParameter(
                "q",
                {"type": "string", "maxLength": 200, "pattern": r"^[^\x00]*$"},
                description="Name contains (case-insensitive).",
            ),
            OpenApiParameter("submittedFrom", s.INSTANT, description=s.INSTANT_HELP),
            OpenApiParameter(
                "submittedTo", s.INSTANT, description=s.INSTANT_HELP + " Inclusive; a date covers its day."
            ),
            OpenApiParameter("dueFrom", s.INSTANT, description=s.INSTANT_HELP),
            OpenApiParameter("dueTo", s.INSTANT, description=s.INSTANT_HELP + " Inclusive; a date covers its day."),
            OpenApiParameter("favorite", OpenApiTypes.BOOL, description="true: starred only; false: unstarred."),
            OpenApiParameter("scheduleId", OpenApiTypes.UUID, description="The calls a schedule made."),
            *PAGING_PARAMS,
        ],
        responses={200: s.ServiceCallPageSerializer, **_problems(400, 401, 404)},
    )
    def get(self, request: Request, tenant_id: str) -> Response:
        queryset = service_calls_for_tenant(tenant_id=self.tenant_id)
        filterset = ServiceCallFilter(request.query_params, queryset=queryset, tenant_id=self.tenant_id)
        limit, cursor = paging_params(request, errors={} if filterset.is_valid() else filter_errors(filterset))
        page = keyset_page(filterset.qs, request, limit=limit, cursor=cursor)
        return self.page_response(page, lambda call: service_call_representation(call, request=request))


class ServiceCallSubmitApi(ServiceCallBaseApi):
    """POST a new call: 202 (created), 200 (idempotent replay), 409 (key reused differently),
    429 past the tenant's submissions ceiling."""

    throttle_classes = [SubmissionThrottle]

    @extend_schema(
        operation_id="service_calls_submit",
        summary="Submit a service call",
        description=(
            "Store a call and run it at `dueAt` (or now). 202 with `Location`; the same idempotency key "
            "with the same payload answers 200 with the stored call, with another payload 409."
        ),
        parameters=[
            TENANT_PARAM,
            s.IDEMPOTENCY_HEADER,
            s.PAST_DUE_HEADER,
        ],
        request=s.SubmitServiceCallSerializer,
        responses={
            202: OpenApiResponse(s.ServiceCallSerializer, description="Accepted; `Location` names the call."),
            200: OpenApiResponse(s.ServiceCallSerializer, description="The call stored earlier under this key."),
            **_problems(400, 401, 403, 404, 409, 413, 429),
        },
    )
    def post(self, request: Request, tenant_id: str) -> Response:
        submission = validate_submission(request.data, idempotency_header=request.headers.get("Idempotency-Key"))
        call, created = service_call_submit(
            tenant_id=self.tenant_id, submission=submission, correlation_id=request.correlation_id
        )
        if created:
            # Just stored: the object in hand is the call as submitted, no need to read it back.
            body = service_call_representation(call, tags=submission.tags, request=request)
        else:
            body = _call(request, self.tenant_id, call.service_call_id)
        return Response(
            body,
            status=status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK,
            headers={"Location": body["links"]["self"], **s.past_due_headers(submission.due_at if created else None)},
        )


class BatchSubmissionThrottle(CountedSubmissionThrottle):
    """A batch counts each of its calls against the submissions ceiling (docs/api.md, "Batches")."""

    def allow_request(self, request: Request, view: Any) -> bool:
        calls = request.data.get("calls") if request.method == "POST" and isinstance(request.data, dict) else None
        self.count = min(len(calls), BATCH_MAX) if isinstance(calls, list) and calls else 1
        return super().allow_request(request, view)


class ServiceCallBatchApi(ServiceCallBaseApi):
    """POST up to 100 calls at once, each accepted or refused on its own."""

    throttle_classes = [BatchSubmissionThrottle]

    @extend_schema(
        operation_id="service_calls_submit_batch",
        summary="Submit up to 100 service calls at once",
        description=(
            "`{calls: [...]}`, each item as `POST .../service-calls` takes one (its own `idempotencyKey`). Each is "
            "checked and accepted or refused on its own; the answer has a result per item, in order: `status` 202 "
            "and the call (stored now), 200 and the call (stored earlier under its key), or 400/409 and the "
            "problem (nothing of it stored). The accepted calls are stored together, in one transaction. A body "
            "that is not `{calls: [1 to 100 items]}` is a 400 for the whole request, and nothing is stored. Each "
            "call counts against the submissions ceiling."
        ),
        parameters=[TENANT_PARAM],
        request=s.BatchInputSerializer,
        responses={
            200: OpenApiResponse(s.BatchOutputSerializer, description="A result per item, in order."),
            **_problems(400, 401, 403, 404, 413, 429),
        },
    )
    def post(self, request: Request, tenant_id: str) -> Response:
        items = validate_batch(request.data)
        results = service_calls_submit_batch(
            tenant_id=self.tenant_id, items=items, correlation_id=request.correlation_id
        )
        answers = [_batch_answer(request, item, result) for item, result in zip(items, results, strict=True)]
        return Response(
            {
                "results": answers,
                "accepted": sum(1 for answer in answers if answer["status"] == 202),
                "replayed": sum(1 for answer in answers if answer["status"] == 200),
                "refused": sum(1 for answer in answers if answer["status"] >= 400),
            }
        )


def _batch_answer(request: Request, item: Submission | ValidationFailed, result: BatchResult) -> dict[str, Any]:
    if result.error is not None:
        error = result.error
        problem = problem_body(
            slug=error.type_slug,
            title=error.title,
            status_code=error.status,
            detail=error.detail,
            correlation_id=request.correlation_id,
            errors=error.errors or None,
        )
        return {"status": error.status, "problem": problem}
    if result.created:
        answer = {"status": 202, "call": service_call_representation(result.call, tags=result.tags, request=request)}
        if isinstance(item, Submission) and (warning := past_due_warning(item.due_at)) is not None:
            answer["warning"] = warning  # what a single submission says in its Warning header
        return answer
    return {"status": 200, "call": _call(request, result.call.tenant_id, result.call.service_call_id)}


class ServiceCallBulkApi(ServiceCallBaseApi):
    """POST an action on every call a filter of the list matches: counted first (`dryRun`)."""

    @extend_schema(
        operation_id="service_calls_bulk",
        summary="Cancel, run again, or tag every call a filter matches",
        description=(
            "`{action: cancel | rerun | addTags | removeTags, filter: {...the list's filters}, tags?, dryRun?}`. "
            "With `dryRun: true`, the count of the calls it would act on, and nothing changes. Otherwise each "
            "matched call, oldest first, goes through the ordinary transition with its event (a cancel races the "
            "timer as a single cancel does); at most 10,000 calls a request: more is a 400 and nothing is done."
        ),
        parameters=[TENANT_PARAM],
        request=s.BulkInputSerializer,
        responses={200: s.BulkOutputSerializer, **_problems(400, 401, 403, 404, 413)},
    )
    def post(self, request: Request, tenant_id: str) -> Response:
        bulk = validate_bulk(request.data)
        calls = bulk_calls_matched(tenant_id=self.tenant_id, bulk=bulk)
        if bulk.action == "rerun" and not bulk.dry_run:
            # Each new call is a submission: charged to the caller's key as a batch's are.
            submissions_charge(request, self, min(calls.count(), BULK_MAX))
        result = service_calls_bulk(
            tenant_id=self.tenant_id,
            calls=calls,
            action=bulk.action,
            tags=bulk.tags,
            dry_run=bulk.dry_run,
            correlation_id=request.correlation_id,
        )
        return Response(
            {
                "action": bulk.action,
                "dryRun": bulk.dry_run,
                "matched": result.matched,
                "limit": BULK_MAX,
                "changed": result.changed,
                "unchanged": result.unchanged,
                "skipped": result.skipped,
                "reasons": result.reasons,
            }
        )


class ServiceCallsApi(ServiceCallListApi, ServiceCallSubmitApi):
    """The collection path: GET is ServiceCallListApi.get, POST is ServiceCallSubmitApi.post."""


class ServiceCallDetailApi(ServiceCallBaseApi):
    """GET one call with its attempt log and its events."""

    @extend_schema(
        operation_id="service_calls_retrieve",
        summary="Get a service call with its attempts and events",
        parameters=[TENANT_PARAM, CALL_PARAM],
        responses={200: s.ServiceCallDetailSerializer, **_problems(401, 404)},
    )
    def get(self, request: Request, tenant_id: str, service_call_id: str) -> Response:
        call = service_call_get(tenant_id=self.tenant_id, service_call_id=service_call_id)
        body = service_call_detail_representation(
            call,
            executions=attempts_for_call(tenant_id=self.tenant_id, service_call_id=call.service_call_id),
            events=events_for_call(tenant_id=self.tenant_id, service_call_id=call.service_call_id),
            request=request,
        )
        return Response(body)


class ServiceCallTagsApi(ServiceCallBaseApi):
    """PUT the whole tag set of a call (emits ServiceCallTagged when it changes)."""

    @extend_schema(
        operation_id="service_calls_tags_set",
        summary="Replace a call's tags",
        parameters=[TENANT_PARAM, CALL_PARAM],
        request=s.TagsInputSerializer,
        responses={200: s.ServiceCallSerializer, **_problems(400, 401, 403, 404, 413)},
    )
    def put(self, request: Request, tenant_id: str, service_call_id: str) -> Response:
        data = request.data
        if not isinstance(data, dict) or "tags" not in data:
            raise ValidationFailed({"tags": ['A body {"tags": [...]} is required.']})
        unknown = set(data) - {"tags"}
        if unknown:
            raise ValidationFailed({"body": [f"Unknown fields: {', '.join(sorted(unknown))}."]})
        call = service_call_tags_set(
            tenant_id=self.tenant_id,
            service_call_id=self.item_id(service_call_id),
            tags=data["tags"],
            correlation_id=request.correlation_id,
        )
        return Response(_call(request, self.tenant_id, call.service_call_id))


class ServiceCallRerunApi(ServiceCallBaseApi):
    """POST: submit a new call with the same request (new id), due now or at the body's dueAt."""

    # A rerun took no body before it took `dueAt`: a client posting an empty form (as test
    # clients and form posts do) still runs it now, and its fields get the same checks. JSON is
    # the documented body.
    parser_classes = [JSONParser, FormParser, MultiPartParser]
    throttle_classes = [SubmissionThrottle]

    @extend_schema(
        operation_id="service_calls_rerun",
        summary="Run a call again",
        parameters=[TENANT_PARAM, CALL_PARAM, s.PAST_DUE_HEADER],
        request={"application/json": s.RerunInputSerializer},
        description=(
            "A new call with the same request, tags (not the star) and retry policy, due now, or at `dueAt` when the "
            "optional body `{dueAt}` gives one (checked as a submission's `dueAt`). 400 for any other "
            "field or a body that is not an object, and if the stored request holds text or nesting that "
            "submissions are now refused for (a call stored before those rules): nothing is stored."
        ),
        responses={
            202: OpenApiResponse(s.ServiceCallSerializer, description="The new call; `Location` names it."),
            **_problems(400, 401, 403, 404, 413, 429),
        },
    )
    def post(self, request: Request, tenant_id: str, service_call_id: str) -> Response:
        due_at = validate_rerun(request.data)
        call = service_call_rerun(
            tenant_id=self.tenant_id,
            service_call_id=self.item_id(service_call_id),
            correlation_id=request.correlation_id,
            due_at=due_at,
        )
        body = _call(request, self.tenant_id, call.service_call_id)
        return Response(
            body,
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": body["links"]["self"], **s.past_due_headers(due_at)},
        )


class ServiceCallCancelApi(ServiceCallBaseApi):
    """POST: call off a Scheduled call (docs/retries.md, 'Cancel')."""

    @extend_schema(
        operation_id="service_calls_cancel",
        summary="Cancel a scheduled call",
        parameters=[TENANT_PARAM, CALL_PARAM],
        request=None,
        description=(
            "A Scheduled call (a first attempt, or a retry waiting for its next one) turns Cancelled and "
            "never starts; event `ServiceCallCancelled`. Cancelling a Cancelled call answers 200 again. "
            "A call already Running or finished answers 409 naming its status, and nothing changes. "
            "Racing the timer, exactly one wins: the call runs (and the cancel gets 409) or it is cancelled."
        ),
        responses={
            200: OpenApiResponse(s.ServiceCallSerializer, description="The call, now Cancelled."),
            **_problems(401, 403, 404),
            (409, PROBLEM_CONTENT_TYPE): OpenApiResponse(
                ProblemSerializer, description="The call is Running or finished (the detail names its status)."
            ),
        },
    )
    def post(self, request: Request, tenant_id: str, service_call_id: str) -> Response:
        call = service_call_cancel(
            tenant_id=self.tenant_id,
            service_call_id=self.item_id(service_call_id),
            correlation_id=request.correlation_id,
        )
        return Response(_call(request, self.tenant_id, call.service_call_id))


EVENTS_DEFAULT_LIMIT = 50
EVENTS_MAX_LIMIT = 200
# A feed iterator is "fs_" and a feed number; opaque to clients, who only pass it back.
ITERATOR_PREFIX = "fs_"
_UUID = r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
AFTER_PATTERN = rf"^(|{ITERATOR_PREFIX}[0-9]{{1,18}}|{_UUID})$"
EVENT_TYPES = [choice.value for choice in OutboxEvent.Type]


class TenantEventsApi(TenantApiView):
    """GET the tenant's events feed: published events oldest first, gap-free across pages
    (docs/architecture.md, 'The events feed')."""

    @extend_schema(
        operation_id="events_list",
        summary="Read the tenant's events feed",
        description=(
            "The tenant's published events, oldest first. Follow `iterator` (pass it as `after`) to "
            "see every event exactly once, in the same order, however events are committed."
        ),
        parameters=[
            TENANT_PARAM,
            OpenApiParameter(
                "after",
                {"type": "string", "pattern": AFTER_PATTERN},
                description=(
                    "The `iterator` of the previous page, or an event's envelope `id` to read on "
                    "behind that event. Absent: from the oldest event kept."
                ),
            ),
            OpenApiParameter(
                "types",
                {"type": "array", "items": {"type": "string", "enum": list(EVENT_TYPES)}},
                style="form",
                explode=False,
                description="Comma-separated event types to return (absent: all); the iterator still moves "
                "past the others.",
            ),
            OpenApiParameter(
                "limit", {"type": "integer", "minimum": 1, "maximum": EVENTS_MAX_LIMIT, "default": EVENTS_DEFAULT_LIMIT}
            ),
        ],
        responses={200: s.EventFeedSerializer, **_problems(400, 401, 404)},
    )
    def get(self, request: Request, tenant_id: str) -> Response:
        errors: dict[str, list[str]] = {}
        try:
            limit = parse_limit(
                request.query_params.get("limit"), default=EVENTS_DEFAULT_LIMIT, maximum=EVENTS_MAX_LIMIT
            )
        except ValueError as exc:
            errors["limit"] = [str(exc)]
        try:
            types = _event_types(request.query_params.getlist("types"))
        except ValueError as exc:
            errors["types"] = [str(exc)]
        try:
            after = self._after(request.query_params.get("after"))
        except ValueError as exc:
            errors["after"] = [str(exc)]
        if errors:
            raise ValidationFailed(errors)
        try:
            page = events_feed(tenant_id=self.tenant_id, after=after, limit=limit, types=types)
        except FeedPositionAhead:
            raise ValidationFailed(
                {"after": ["This iterator is ahead of this tenant's feed: pass one this feed returned."]}
            ) from None
        return Response(
            {
                "data": [event_representation(row) for row in page.events],
                "iterator": f"{ITERATOR_PREFIX}{page.position}",
                "done": page.done,
            }
        )

    def _after(self, raw: str | None) -> int:
        raw = (raw or "").strip()
        if raw == "":
            return 0
        digits = raw.removeprefix(ITERATOR_PREFIX)
        if digits != raw and digits.isascii() and digits.isdigit() and len(digits) <= 18:
            return int(digits)
        try:
            event_id = uuid.UUID(raw)
        except ValueError:
            raise ValueError("after must be the iterator of a previous page or an event's id.") from None
        position = feed_seq_of_event(tenant_id=self.tenant_id, event_id=event_id)
        if position is None:
            raise ValueError("No published event of this tenant has this id; resume from an iterator.")
        return position


def _event_types(raw_values: list[str]) -> set[str] | None:
    names = {name.strip() for raw in raw_values for name in raw.split(",") if name.strip()}
    unknown = sorted(names - set(EVENT_TYPES))
    if unknown:
        shown = ", ".join(name[:64] for name in unknown[:5])
        raise ValueError(f"Unknown event type ({shown}); known types: {', '.join(EVENT_TYPES)}.")
    return names or None
