"""Operator admin of recurring schedules (docs/schedules.md): read-only rows, scoped like every
product admin (tenants.admin), with the actions Pause and Resume, which go through
schedules.services like the API's PATCH. Secret header values are never shown."""

from __future__ import annotations

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from core.errors import NotFound
from core.ids import new_id, short_id
from core.rendering import display_json
from orchestration.services import public_request_spec
from schedules.cron import local_iso
from schedules.models import Schedule
from schedules.representation import next_runs
from schedules.selectors import schedule_calls, skipped_of, with_overlap_skipped
from schedules.services import schedule_set_paused
from tenants.admin import ReadOnlyAdmin


def _pretty_json(value) -> str:
    return format_html('<pre style="white-space:pre-wrap;margin:0">{}</pre>', display_json(value))


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    list_display = ("name", "tenant", "plan_text", "timezone", "paused", "next_run", "skipped", "created_at")
    list_filter = ("paused", ("tenant", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("tenant",)
    search_fields = ("name", "cron")
    ordering = ("-created_at",)
    fields = (
        "schedule_id",
        "tenant",
        "name",
        "cron",
        "every_s",
        "timezone",
        "dst_skipped",
        "dst_repeated",
        "start_at",
        "end_at",
        "paused",
        "paused_note",
        "overlap",
        "catchup_window_s",
        "jitter_ms",
        "next_runs_shown",
        "last_occurrence_at",
        "skipped",
        "skipped_by_reason",
        "request_shown",
        "tags",
        "retry_policy_shown",
        "recent_calls",
        "created_at",
        "updated_at",
    )
    readonly_fields = fields
    actions = ["pause", "resume"]

    def get_queryset(self, request):
        return with_overlap_skipped(super().get_queryset(request))

    @admin.display(description="skipped")
    def skipped(self, obj: Schedule) -> int:
        return skipped_of(obj)[0]

    @admin.display(description="skipped, by reason")
    def skipped_by_reason(self, obj: Schedule) -> str:
        return ", ".join(f"{reason}: {count}" for reason, count in sorted(skipped_of(obj)[1].items())) or "—"

    @admin.display(description="next run (its zone)")
    def next_run(self, obj: Schedule) -> str:
        runs = next_runs(obj, count=1)
        return local_iso(runs[0], obj.timezone) if runs else "—"

    @admin.display(description="next runs (its zone)")
    def next_runs_shown(self, obj: Schedule) -> str:
        runs = next_runs(obj)
        if not runs:
            return "— (paused or ended)"
        return format_html_join(mark_safe("<br>"), "{}", ((local_iso(at, obj.timezone),) for at in runs))

    @admin.display(description="request (secrets redacted)")
    def request_shown(self, obj: Schedule) -> str:
        return _pretty_json(public_request_spec(obj.request_spec))

    @admin.display(description="retry policy")
    def retry_policy_shown(self, obj: Schedule) -> str:
        return _pretty_json(obj.retry_policy) if obj.retry_policy else "— (one attempt)"

    @admin.display(description="recent calls")
    def recent_calls(self, obj: Schedule) -> str:
        calls = schedule_calls(schedule=obj, limit=10)
        if not calls:
            return "—"
        return format_html(
            "<table><thead><tr><th>call</th><th>occurrence</th><th>status</th></tr></thead><tbody>{}</tbody></table>",
            format_html_join(
                "",
                '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td></tr>',
                (
                    (
                        reverse("admin:orchestration_servicecall_change", args=[call.service_call_id]),
                        short_id(call.service_call_id),
                        local_iso(call.occurrence_at, obj.timezone),
                        call.status,
                        call.overlap_state,
                    )
                    for call in calls
                ),
            ),
        )

    def has_pause_permission(self, request) -> bool:
        # Pausing or resuming changes what the schedule runs.
        return request.user.has_perm("schedules.change_schedule")

    def _set_paused(self, request, queryset, *, paused: bool) -> None:
        done = []
        for schedule in queryset:
            try:
                schedule_set_paused(
                    tenant_id=schedule.tenant_id,
                    schedule_id=schedule.schedule_id,
                    paused=paused,
                    correlation_id=getattr(request, "correlation_id", None) or str(new_id()),
                )
            except NotFound:  # deleted meanwhile
                continue
            done.append(schedule.name)
        verb = "Paused" if paused else "Resumed"
        self.message_user(request, f"{verb} {len(done)} schedule(s): {', '.join(done)}.", messages.SUCCESS)

    @admin.action(description="Pause (cancel the call made ahead, make no more)", permissions=["pause"])
    def pause(self, request, queryset):
        self._set_paused(request, queryset.filter(paused=False), paused=True)

    @admin.action(description="Resume (plan from now)", permissions=["pause"])
    def resume(self, request, queryset):
        self._set_paused(request, queryset.filter(paused=True), paused=False)
