"""Operator admin of the attempt log (read-only, headers shown redacted), of the tenants' signed
calls (docs/api.md, "Signed calls"): turned on (the secret shown once), off, or rotated; and of
their connections (docs/connections.md), whose secrets it never shows."""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import admin
from django.db.models import Q
from django.http import HttpResponseRedirect
from django.urls import reverse

from core.admin import ShownOnceMixin, headers_table, shown_once_response
from core.errors import Conflict, ValidationFailed
from core.ids import short_id
from execution.connections import (
    CLIENT_AUTH,
    SECRET,
    SHOWN,
    connection_create,
    connection_delete,
    connection_update,
    connection_users,
    validate_connection,
)
from execution.models import CallSigning, Connection, HttpExecution
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
        "connection_name",
        "earlier_tries",
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


class ConnectionAdminForm(forms.ModelForm):
    """A connection's fields as the API takes them (execution.connections.validate_connection
    checks them; its wire-named errors are shown beside the fields). The secret is typed, never
    shown: empty on a change keeps it."""

    username = forms.CharField(required=False, help_text="basic")
    headerName = forms.CharField(required=False, label="Header name", help_text="apiKeyHeader")
    tokenUrl = forms.CharField(required=False, label="Token URL", help_text="oauth2ClientCredentials")
    clientId = forms.CharField(required=False, label="Client id", help_text="oauth2ClientCredentials")
    scope = forms.CharField(required=False, help_text="oauth2ClientCredentials, optional")
    audience = forms.CharField(required=False, help_text="oauth2ClientCredentials, optional")
    clientAuth = forms.ChoiceField(
        required=False, label="Client authentication", choices=[("", "—"), *((c, c) for c in CLIENT_AUTH)]
    )
    secret_value = forms.CharField(
        required=False,
        label="Secret",
        strip=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="The password, header value or client secret. Stored sealed, never shown; empty keeps it.",
    )

    class Meta:
        model = Connection
        fields = ("tenant", "name", "kind")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            for field, value in self.instance.config.items():
                if field in self.fields:
                    self.initial[field] = value

    def clean(self):
        cleaned = super().clean()
        existing = self.instance if self.instance.pk else None
        kind = existing.kind if existing else cleaned.get("kind")
        if kind not in SHOWN:
            return cleaned
        data = {} if existing else {"name": cleaned.get("name"), "kind": kind}
        for field in (*SHOWN[kind][0], *SHOWN[kind][1]):
            value = (cleaned.get(field) or "").strip()
            if value or (existing is None and field in SHOWN[kind][0]):
                data[field] = value
        if cleaned.get("secret_value") or existing is None:
            data[SECRET[kind]] = cleaned.get("secret_value") or ""
        try:
            self.checked = validate_connection(data, existing=existing)
        except ValidationFailed as exc:
            for field, messages in exc.errors.items():
                target = "secret_value" if field in SECRET.values() else field
                self.add_error(target if target in self.fields else None, messages)
        return cleaned


ALL_SHOWN = tuple(dict.fromkeys(field for required, optional in SHOWN.values() for field in (*required, *optional)))


@admin.register(Connection)
class ConnectionAdmin(TenantScopedAdmin):
    """A tenant's connections (docs/connections.md): made and changed through the same checks as
    the API; never showing a secret; not deleted while a live call or a schedule names them."""

    form = ConnectionAdminForm
    list_display = ("name", "tenant", "kind", "secret_updated_at", "updated_at")
    list_filter = ("kind", ("tenant", admin.RelatedOnlyFieldListFilter))
    search_fields = ("name",)

    def get_fields(self, request, obj=None):
        shown = SHOWN[obj.kind][0] + SHOWN[obj.kind][1] if obj else ALL_SHOWN
        head = ("tenant", "name", "kind") if obj is None else ("tenant", "name", "kind", "secret_updated_at")
        return (*head, *shown, "secret_value")

    def get_readonly_fields(self, request, obj=None):
        return ("tenant", "name", "kind", "secret_updated_at") if obj else ()

    def save_model(self, request, obj, form, change):
        if change:
            saved = connection_update(tenant_id=obj.tenant_id, name=obj.name, data=form.checked)
        else:
            saved = connection_create(tenant_id=obj.tenant_id, data=form.checked)
        obj.pk = saved.pk
        obj.refresh_from_db()

    def delete_model(self, request, obj):
        connection_delete(tenant_id=obj.tenant_id, name=obj.name)

    def delete_queryset(self, request, queryset):
        for connection in queryset:
            connection_delete(tenant_id=connection.tenant_id, name=connection.name)

    def delete_view(self, request, object_id, extra_context=None):
        # What names the connection is said before the confirmation page, not as a failure after it.
        connection = self.get_object(request, object_id)
        if connection is not None and self.has_delete_permission(request, connection):
            users = connection_users(tenant_id=connection.tenant_id, name=connection.name)
            if users:
                self.message_user(
                    request, f"Not deleted: in use by {', '.join(users)}. Cancel or change them first.", level="error"
                )
                return HttpResponseRedirect(reverse("admin:execution_connection_change", args=[connection.pk]))
        return super().delete_view(request, object_id, extra_context)

    def response_action(self, request, queryset):
        try:
            return super().response_action(request, queryset)
        except Conflict as exc:
            self.message_user(request, f"Stopped: {exc.detail}", level="error")
            return HttpResponseRedirect(request.get_full_path())
