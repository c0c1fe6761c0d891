"""Operator admin of the attempt log: read-only, headers shown redacted."""

from __future__ import annotations

import uuid

from django.contrib import admin
from django.db.models import Q

from core.admin import headers_table
from core.ids import short_id
from execution.models import HttpExecution
from tenants.admin import ReadOnlyAdmin


@admin.register(HttpExecution)
class HttpExecutionAdmin(ReadOnlyAdmin):
    list_display = (
        "short_id",
        "service_call_id",
        "tenant",
        "state",
        "request_method",
        "request_url",
        "response_status",
        "latency_ms",
        "error_kind",
        "started_at",
    )
    list_filter = (
        "state",
        "error_kind",
        "request_method",
        ("tenant", admin.RelatedOnlyFieldListFilter),
        ("started_at", admin.DateFieldListFilter),
    )
    search_fields = ("request_url",)
    search_help_text = "URL contains the text, or the call's id matches."
    list_per_page = 100
    show_full_result_count = False
    fields = (
        "execution_id",
        "service_call",
        "tenant",
        "attempt",
        "state",
        "worker_id",
        "started_at",
        "finished_at",
        "request_method",
        "request_url",
        "request_headers_shown",
        "request_body",
        "timeout_ms",
        "response_status",
        "response_headers_shown",
        "response_body",
        "response_body_truncated",
        "latency_ms",
        "error_kind",
        "error_message",
    )
    readonly_fields = fields

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(request_url__icontains=term)
        try:
            condition |= Q(service_call_id=uuid.UUID(term))
        except ValueError:
            pass
        return queryset.filter(condition), False

    @admin.display(description="id")
    def short_id(self, obj: HttpExecution) -> str:
        return short_id(obj.execution_id)

    @admin.display(description="request headers (secrets redacted)")
    def request_headers_shown(self, obj: HttpExecution) -> str:
        return headers_table(obj.request_headers)

    @admin.display(description="response headers")
    def response_headers_shown(self, obj: HttpExecution) -> str:
        return headers_table(obj.response_headers)
