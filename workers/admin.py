"""Operator admin of worker sessions and their loop runs: read-only records (docs/architecture.md).

They describe the workers, not any tenant, so they are not tenant-scoped; but an error's text
is whatever the exception said, and a database error quotes the row it failed on (tenant ids,
call ids). Staff scoped to tenants see that a loop failed and the error's type; its text is
for superusers (docs/security.md §5).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.db.models.constants import LOOKUP_SEP
from django.utils.html import format_html

from core.ids import utcnow
from tenants.admin import ReadOnlyMixin
from workers.models import LoopRun, WorkerSession

ERROR_TEXT_FIELDS = ("error_message", "error_short")


def touches_error_text(name) -> bool:
    """Whether a field name, lookup (`error_message__startswith`), ordering (`-error_message`)
    or search field (`^error_message`) reaches an error's text; a callable column does not."""
    if not isinstance(name, str):
        return False
    return any(part in ERROR_TEXT_FIELDS for part in name.lstrip("-^=@").split(LOOKUP_SEP))


def without_error_text(request, names):
    if request.user.is_superuser:
        return names
    return [name for name in names if not touches_error_text(name)]


class ReadOnly(ReadOnlyMixin, admin.ModelAdmin):
    def get_fields(self, request, obj=None):
        return without_error_text(request, super().get_fields(request, obj))

    def get_list_display(self, request):
        return without_error_text(request, super().get_list_display(request))

    def get_search_fields(self, request):
        return without_error_text(request, super().get_search_fields(request))

    def lookup_allowed(self, lookup, value, request=None):
        # Django allows any lookup on a local field, so a hidden text would still answer
        # `?error_message__startswith=…` one guessed prefix at a time: refused (400) instead.
        if touches_error_text(lookup) and (request is None or not request.user.is_superuser):
            return False
        return super().lookup_allowed(lookup, value, request)


class LoopRunInline(ReadOnlyMixin, admin.TabularInline):
    model = LoopRun
    extra = 0
    can_delete = False
    fields = ("loop", "started_at", "runs", "duration_ms", "items", "errors", "error_message")
    readonly_fields = fields
    ordering = ("-started_at",)
    max_num = 0

    def get_queryset(self, request):
        return super().get_queryset(request).filter(errors__gt=0)

    def get_fields(self, request, obj=None):
        return without_error_text(request, super().get_fields(request, obj))

    verbose_name_plural = "loop runs with errors"


@admin.register(WorkerSession)
class WorkerSessionAdmin(ReadOnly):
    list_display = ("id", "hostname", "pid", "status", "started_at", "last_heartbeat_at", "heartbeat_age", "stopped_at")
    list_filter = ("status", "hostname")
    search_fields = ("id", "hostname")
    inlines = [LoopRunInline]

    @admin.display(description="heartbeat age")
    def heartbeat_age(self, obj: WorkerSession) -> str:
        age = (utcnow() - obj.last_heartbeat_at).total_seconds()
        if obj.status == WorkerSession.Status.RUNNING and age > settings.WORKER_STALE_SECONDS:
            return format_html('<strong style="color:#a12a2a">{} s (stale)</strong>', f"{age:.1f}")
        return f"{age:.1f} s"


class HasErrorsFilter(admin.SimpleListFilter):
    title = "errors"
    parameter_name = "errors"

    def lookups(self, request, model_admin):
        return [("yes", "With errors"), ("no", "Without errors")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(errors__gt=0)
        if self.value() == "no":
            return queryset.filter(errors=0)
        return queryset


@admin.register(LoopRun)
class LoopRunAdmin(ReadOnly):
    list_display = ("loop", "session", "started_at", "runs", "duration_ms", "items", "errors", "error_short")
    list_filter = ("loop", HasErrorsFilter, ("started_at", admin.DateFieldListFilter))
    list_select_related = ("session",)
    list_per_page = 100
    show_full_result_count = False

    @admin.display(description="error")
    def error_short(self, obj: LoopRun) -> str:
        return obj.error_message[:120] or "—"
