"""Operator admin of service calls: filters by tag, status, tenant and dates; read-only state.

Call state changes only through orchestration's services (the "Run again" action calls
service_call_rerun, "Cancel" service_call_cancel). Secret header values are never shown: the request is rendered through
public_request_spec and every header table through redact_headers.
"""

from __future__ import annotations

import re
import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import Count, Prefetch, Q
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from core.errors import Conflict, ValidationFailed
from core.ids import new_id, short_id
from core.rendering import display_json
from execution.models import HttpExecution
from orchestration.admission import flow_control_set, held_count, held_ms_of
from orchestration.filters import ServiceCallFilter
from orchestration.flow import UNLIMITED, validate_flow_control
from orchestration.models import FlowControl, ServiceCall, ServiceCallTag
from orchestration.representation import outcome_representation
from orchestration.services import public_request_spec, service_call_cancel, service_call_rerun
from orchestration.services.bulk import service_calls_bulk
from orchestration.validation import validate_tags
from outbox.models import OutboxEvent
from tenants.admin import ReadOnlyAdmin, ReadOnlyInline, TenantScopedAdmin, visible_tenant_ids
from timer.models import TimerSchedule

_ID_PREFIX = re.compile(r"^[0-9a-fA-F-]{4,36}$")
TAG_CHOICES_LIMIT = 100


def pretty_json(value) -> str:
    return format_html('<pre style="white-space:pre-wrap;margin:0">{}</pre>', display_json(value))


class TagListFilter(admin.SimpleListFilter):
    """Calls carrying a tag: an EXISTS over service_call_tags (the shared FilterSet), in SQL."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        rows = ServiceCallTag.objects.all()
        ids = visible_tenant_ids(request)
        if ids is not None:
            rows = rows.filter(tenant_id__in=ids)
        top = rows.values("tag").annotate(n=Count("id")).order_by("-n", "tag")[:TAG_CHOICES_LIMIT]
        return [(row["tag"], f"{row['tag']} ({row['n']})") for row in top]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        filterset = ServiceCallFilter({"tag": [value]}, queryset=queryset)
        return filterset.qs if filterset.is_valid() else queryset.none()


class TagInline(ReadOnlyInline):
    model = ServiceCallTag
    fields = ("tag",)
    readonly_fields = ("tag",)
    verbose_name_plural = "tags"


class TimerInline(ReadOnlyInline):
    model = TimerSchedule
    fields = ("state", "due_at", "registered_at", "reached_at", "correlation_id")
    readonly_fields = fields
    verbose_name_plural = "timer"


class AttemptInline(ReadOnlyInline):
    """The attempt log's row for this call; its headers (redacted) are on the attempt's own page."""

    model = HttpExecution
    fields = (
        "attempt",
        "state",
        "worker_id",
        "started_at",
        "finished_at",
        "response_status",
        "latency_ms",
        "error_kind",
        "error_message",
    )
    readonly_fields = fields
    verbose_name_plural = "attempts"
    show_change_link = True


@admin.register(ServiceCall)
class ServiceCallAdmin(ReadOnlyAdmin):
    # The submission time is the page's date hierarchy (and the id's order); the attempt and
    # the error kind go with the status: the list fits a laptop's width.
    list_display = ("short_id", "name", "tenant", "status_shown", "due_at", "started_at", "finished_at", "tag_list")
    list_filter = (
        "status",
        TagListFilter,
        ("tenant", admin.RelatedOnlyFieldListFilter),
        "error_kind",
        ("submitted_at", admin.DateFieldListFilter),
        ("due_at", admin.DateFieldListFilter),
    )
    search_fields = ("name",)
    search_help_text = "Name or URL contains the text, or the id (or its first or last characters) matches."
    date_hierarchy = "submitted_at"
    list_per_page = 50
    show_full_result_count = False
    fields = (
        "service_call_id",
        "tenant",
        "name",
        "status",
        "error_kind",
        "submitted_at",
        "due_at",
        "started_at",
        "finished_at",
        "request_shown",
        "attempt_shown",
        "next_attempt_at",
        "held_shown",
        "retry_policy_shown",
        "outcome_shown",
        "last_error_shown",
        "correlation_id",
        "idempotency_key",
        "rerun_of",
        "schedule_id",
        "occurrence_at",
        "overlap",
        "overlap_state",
        "events_shown",
    )
    readonly_fields = fields
    inlines = [TagInline, TimerInline, AttemptInline]
    actions = ["run_again", "cancel", "add_tag", "remove_tag"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .select_related("tenant")
            .prefetch_related(Prefetch("tag_rows", queryset=ServiceCallTag.objects.order_by("id")))
        )

    def get_search_results(self, request, queryset, search_term):
        for term in search_term.split():
            condition = Q(name__icontains=term) | Q(request_spec__url__icontains=term)
            try:
                condition |= Q(pk=uuid.UUID(term))
            except ValueError:
                if _ID_PREFIX.match(term):
                    # Pages show the last 8 digits; a pasted prefix works too.
                    condition |= Q(service_call_id__istartswith=term) | Q(service_call_id__iendswith=term)
            queryset = queryset.filter(condition)
        return queryset, False

    @admin.display(description="id", ordering="service_call_id")
    def short_id(self, obj: ServiceCall) -> str:
        return short_id(obj.service_call_id)

    @admin.display(description="status", ordering="status")
    def status_shown(self, obj: ServiceCall) -> str:
        colours = {
            ServiceCall.Status.SCHEDULED: "#34509f",
            ServiceCall.Status.RUNNING: "#875800",
            ServiceCall.Status.SUCCEEDED: "#1d6b3f",
            ServiceCall.Status.FAILED: "#a12a2a",
            ServiceCall.Status.CANCELLED: "#5b5b5b",
        }
        return format_html(
            '<strong style="color:{}">{}</strong><br><small>{}{}</small>',
            colours.get(obj.status, "inherit"),
            obj.status,
            f"attempt {self.attempt_shown(obj)}",
            f" · {obj.error_kind}" if obj.error_kind else "",
        )

    @admin.display(description="attempt", ordering="attempts")
    def attempt_shown(self, obj: ServiceCall) -> str:
        """Attempts made, of the most the call's retry policy allows: "2 of 5"."""
        most = (obj.retry_policy or {}).get("maxAttempts", 1)
        return f"{obj.attempts} of {most}"

    @admin.display(description="next attempt at")
    def next_attempt_at(self, obj: ServiceCall):
        waiting = obj.status == ServiceCall.Status.SCHEDULED and obj.attempts
        return obj.due_at if waiting else "—"

    @admin.display(description="held by flow control")
    def held_shown(self, obj: ServiceCall) -> str:
        held = held_ms_of(obj)
        if obj.held_since is not None:
            return f"waiting since {obj.held_since:%Y-%m-%d %H:%M:%S} UTC ({held / 1000:.1f} s so far)"
        return f"{held / 1000:.1f} s" if held else "—"

    @admin.display(description="retry policy")
    def retry_policy_shown(self, obj: ServiceCall) -> str:
        return pretty_json(obj.retry_policy) if obj.retry_policy else "— (one attempt)"

    @admin.display(description="last error (before the next attempt)")
    def last_error_shown(self, obj: ServiceCall) -> str:
        if obj.is_terminal or not obj.outcome_meta:
            return "—"
        return pretty_json((outcome_representation(obj.outcome_meta) or {}).get("errorMeta"))

    @admin.display(description="tags")
    def tag_list(self, obj: ServiceCall) -> str:
        return ", ".join(row.tag for row in obj.tag_rows.all())

    @admin.display(description="request (secrets redacted)")
    def request_shown(self, obj: ServiceCall) -> str:
        return pretty_json(public_request_spec(obj.request_spec))

    @admin.display(description="outcome")
    def outcome_shown(self, obj: ServiceCall) -> str:
        outcome = outcome_representation(obj.outcome_meta) if obj.is_terminal else None
        return pretty_json(outcome) if outcome else "—"

    @admin.display(description="events")
    def events_shown(self, obj: ServiceCall) -> str:
        # The outbox has no foreign key to calls: its rows are listed here by aggregate id.
        rows = OutboxEvent.objects.filter(tenant_id=obj.tenant_id, aggregate_id=obj.service_call_id).order_by("id")
        if not rows:
            return "—"
        return format_html(
            "<table><thead><tr><th>#</th><th>type</th><th>created</th><th>published</th><th>attempts</th>"
            "<th>last error</th></tr></thead><tbody>{}</tbody></table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                (
                    (
                        row.id,
                        row.event_type,
                        row.created_at,
                        row.published_at or "unpublished",
                        row.attempts,
                        row.last_error[:200] or "—",
                    )
                    for row in rows
                ),
            ),
        )

    def has_rerun_permission(self, request) -> bool:
        # Running again submits a new call.
        return request.user.has_perm("orchestration.add_servicecall")

    @admin.action(description="Run again (submit a new call with the same request)", permissions=["rerun"])
    def run_again(self, request, queryset):
        created = []
        for call in queryset:
            new_call = service_call_rerun(
                tenant_id=call.tenant_id,
                service_call_id=call.service_call_id,
                correlation_id=getattr(request, "correlation_id", None) or str(new_id()),
            )
            created.append(short_id(new_call.service_call_id))
        self.message_user(request, f"Submitted {len(created)} new call(s): {', '.join(created)}.", messages.SUCCESS)

    def has_cancel_permission(self, request) -> bool:
        # Cancelling changes a call's state.
        return request.user.has_perm("orchestration.change_servicecall")

    @admin.action(description="Cancel (Scheduled calls only)", permissions=["cancel"])
    def cancel(self, request, queryset):
        cancelled, refused = [], []
        for call in queryset:
            try:
                service_call_cancel(
                    tenant_id=call.tenant_id,
                    service_call_id=call.service_call_id,
                    correlation_id=getattr(request, "correlation_id", None) or str(new_id()),
                )
                cancelled.append(short_id(call.service_call_id))
            except Conflict:
                refused.append(f"{short_id(call.service_call_id)} ({call.status})")
        if cancelled:
            self.message_user(request, f"Cancelled {len(cancelled)} call(s): {', '.join(cancelled)}.", messages.SUCCESS)
        if refused:
            self.message_user(
                request,
                f"Not cancelled, no longer Scheduled: {', '.join(refused)}.",
                messages.WARNING,
            )

    @admin.action(description="Add a tag", permissions=["cancel"])
    def add_tag(self, request, queryset):
        return self._tag_action(request, queryset, "addTags")

    @admin.action(description="Remove a tag", permissions=["cancel"])
    def remove_tag(self, request, queryset):
        return self._tag_action(request, queryset, "removeTags")

    def _tag_action(self, request, queryset, action: str):
        """A tag added to or removed from the selected calls (all those a filter matches, with
        "Select all"), each an ordinary tag change with its event, as the API's bulk action does
        (orchestration.services.bulk). First a page that asks for the tag."""
        verb = "add" if action == "addTags" else "remove"
        tag = request.POST.get("tag", "") if "apply" in request.POST else None
        errors: list[str] = []
        if tag is not None:
            try:
                tags = validate_tags([tag.strip()]) if tag.strip() else []
                if not tags:
                    raise ValidationFailed({"tags": ["A tag is required."]})
            except ValidationFailed as exc:
                errors = [message for found in exc.errors.values() for message in found]
            else:
                changed = matched = 0
                for tenant_id in queryset.values_list("tenant_id", flat=True).distinct().order_by():
                    try:
                        result = service_calls_bulk(
                            tenant_id=tenant_id,
                            calls=queryset.filter(tenant_id=tenant_id),
                            action=action,
                            tags=tags,
                            dry_run=False,
                            correlation_id=getattr(request, "correlation_id", None) or str(new_id()),
                        )
                    except ValidationFailed as exc:
                        self.message_user(request, " ".join(exc.errors.get("filter", [exc.detail])), messages.ERROR)
                        return None
                    changed, matched = changed + result.changed, matched + result.matched
                done = "added to" if action == "addTags" else "removed from"
                self.message_user(request, f"Tag {tags[0]!r} {done} {changed} of {matched} call(s).", messages.SUCCESS)
                return None
        return TemplateResponse(
            request,
            "admin/tag_action.html",
            {
                **self.admin_site.each_context(request),
                "title": f"{verb.capitalize()} a tag",
                "verb": verb,
                "action": request.POST.get("action"),
                "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
                "select_across": request.POST.get("select_across", "0"),
                "count": queryset.count(),
                "errors": errors,
                "opts": self.model._meta,
            },
        )


class FlowControlForm(forms.ModelForm):
    """The limits as the API takes them, checked by orchestration.flow.validate_flow_control."""

    hosts = forms.JSONField(
        required=False,
        help_text='Per target host: {"api.example.com": {"parallelism": 2, "ratePerSecond": 5}}.',
    )

    class Meta:
        model = FlowControl
        fields = ("tenant", "parallelism", "rate_per_second", "hosts")

    def clean(self):
        data = super().clean()
        wire = {
            "parallelism": data.get("parallelism"),
            "ratePerSecond": data.get("rate_per_second"),
            "hosts": data.get("hosts") or {},
        }
        fields = {"parallelism": "parallelism", "ratePerSecond": "rate_per_second"}
        try:
            self.limits = validate_flow_control(wire)
        except ValidationFailed as exc:
            for name, messages_ in exc.errors.items():
                field = fields.get(name, "hosts")
                if field in self.fields:
                    self.add_error(field, [f"{name}: {m}" if field == "hosts" else m for m in messages_])
            return data
        if not self.limits.limited:
            raise forms.ValidationError("Set at least one limit; delete the flow control to remove them all.")
        return data


@admin.register(FlowControl)
class FlowControlAdmin(TenantScopedAdmin):
    """A tenant's flow-control limits; every change goes through orchestration's
    flow_control_set, never a direct save (docs/flow-control.md)."""

    form = FlowControlForm
    list_display = ("tenant", "parallelism", "rate_per_second", "host_count", "held_now", "updated_at")
    search_fields = ("tenant__id", "tenant__name")
    readonly_fields = ("updated_at", "held_now")

    def get_readonly_fields(self, request, obj=None):
        # The tenant is the row's key: chosen when adding, fixed after.
        return (*self.readonly_fields, "tenant") if obj is not None else self.readonly_fields

    @admin.display(description="hosts")
    def host_count(self, obj: FlowControl) -> int:
        return len(obj.hosts or {})

    @admin.display(description="calls held now")
    def held_now(self, obj: FlowControl) -> int:
        return held_count(tenant_id=obj.tenant_id) if obj.tenant_id else 0

    def save_model(self, request, obj, form, change):
        flow_control_set(tenant_id=obj.tenant_id, limits=form.limits)

    def delete_model(self, request, obj):
        flow_control_set(tenant_id=obj.tenant_id, limits=UNLIMITED)

    def delete_queryset(self, request, queryset):
        for tenant_id in queryset.values_list("tenant_id", flat=True):
            flow_control_set(tenant_id=tenant_id, limits=UNLIMITED)
