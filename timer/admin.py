"""Operator admin of timers: read-only, the timer module registers and fires them."""

from __future__ import annotations

import uuid

from django.contrib import admin
from django.db.models import Q

from tenants.admin import ReadOnlyAdmin
from timer.models import TimerSchedule


@admin.register(TimerSchedule)
class TimerScheduleAdmin(ReadOnlyAdmin):
    list_display = ("id", "service_call_id", "tenant", "state", "due_at", "registered_at", "reached_at", "lateness")
    list_filter = ("state", ("tenant", admin.RelatedOnlyFieldListFilter), ("due_at", admin.DateFieldListFilter))
    search_fields = ("correlation_id",)
    search_help_text = "Correlation id, or the call's id (or its first characters)."
    list_per_page = 100
    show_full_result_count = False

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(correlation_id=term)
        try:
            condition |= Q(service_call_id=uuid.UUID(term))
        except ValueError:
            condition |= Q(service_call__service_call_id__istartswith=term)
        return queryset.filter(condition), False

    @admin.display(description="reached late by")
    def lateness(self, obj: TimerSchedule) -> str:
        if obj.reached_at is None:
            return "—"
        return f"{(obj.reached_at - obj.due_at).total_seconds() * 1000:.0f} ms"
