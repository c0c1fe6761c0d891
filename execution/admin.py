"""Operator admin of the attempt log (read-only, headers shown redacted) and of the tenants' signed
calls (docs/api.md, "Signed calls"): turned on (the secret shown once), off, or rotated."""

from __future__ import annotations

import uuid

from django.contrib import admin
from django.db.models import Q
from django.urls import reverse

from core.admin import ShownOnceMixin, headers_table, shown_once_response
from core.ids import short_id
from execution.models import CallSigning, HttpExecution
from execution.signing import call_signing_set
from tenants.admin import ReadOnlyAdmin, TenantScopedAdmin


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


@admin.register(CallSigning)
class CallSigningAdmin(ShownOnceMixin, TenantScopedAdmin):
    """A row per tenant that signs its calls (or did): adding one signs them and shows the secret
    once; "enabled" turns signing off and on again (with the same secret); the action rotates it."""

    list_display = ("tenant", "enabled", "secret_created_at", "previous_secret_until", "updated_at")
    list_filter = ("enabled",)
    search_fields = ("tenant__id",)
    actions = ["rotate_secret"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("tenant",)
        return ("tenant", "enabled", "secret_created_at", "previous_secret_until", "updated_at")

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("tenant", "secret_created_at", "previous_secret_until", "updated_at")

    def save_model(self, request, obj, form, change):
        enabled = obj.enabled if change else True
        _, secret = call_signing_set(tenant_id=obj.tenant_id, enabled=enabled)
        if change:
            obj.refresh_from_db()
        else:
            obj.pk = obj.tenant_id
        if secret:
            # The secret exists only in this response (response_add); stored, it is sealed.
            request.shown_once = secret

    def shown_once_title(self, obj) -> str:
        return f"Signing secret of tenant {obj.tenant_id}'s calls"

    @admin.action(description="Rotate the signing secret (one tenant at a time)", permissions=["change"])
    def rotate_secret(self, request, queryset):
        rows = list(queryset[:2])
        if len(rows) != 1 or not rows[0].enabled:
            self.message_user(
                request, "Select one tenant whose calls are signed: its new secret is shown once.", level="error"
            )
            return None
        _, secret = call_signing_set(tenant_id=rows[0].tenant_id, enabled=True, rotate=True)
        return shown_once_response(
            request,
            context=self.admin_site.each_context(request),
            title=f"New signing secret of tenant {rows[0].tenant_id}'s calls (the previous one signs too for 24 hours)",
            secret=secret,
            next_url=reverse("admin:execution_callsigning_change", args=[rows[0].pk]),
        )
