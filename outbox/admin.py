"""Operator admin of the outbox: publication state and lag; "publish again" via outbox.services."""

from __future__ import annotations

import uuid

from django.contrib import admin, messages
from django.db.models import Q
from django.utils.html import format_html

from core.ids import short_id, utcnow
from core.rendering import display_json
from outbox.models import OutboxEvent
from outbox.services import outbox_publish_again
from tenants.admin import ReadOnlyAdmin, visible_tenant_ids


class PublishedFilter(admin.SimpleListFilter):
    title = "publication"
    parameter_name = "published"

    def lookups(self, request, model_admin):
        return [("yes", "Published"), ("no", "Unpublished"), ("retrying", "Unpublished, failed before")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(published_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(published_at__isnull=True)
        if self.value() == "retrying":
            return queryset.filter(published_at__isnull=True, attempts__gt=0)
        return queryset


class TenantIdFilter(admin.SimpleListFilter):
    """The outbox keeps tenant ids without a foreign key; choices are the visible tenants."""

    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request, model_admin):
        from tenants.models import Tenant

        ids = visible_tenant_ids(request)
        tenants = Tenant.objects.all() if ids is None else Tenant.objects.filter(id__in=ids)
        return [(tenant.id, tenant.id) for tenant in tenants.order_by("id")[:200]]

    def queryset(self, request, queryset):
        return queryset.filter(tenant_id=self.value()) if self.value() else queryset


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "event_type",
        "tenant_id",
        "aggregate_short",
        "created_at",
        "published_at",
        "lag",
        "attempts",
        "last_error_short",
    )
    list_filter = (PublishedFilter, "event_type", TenantIdFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("tenant_id",)
    search_help_text = "The call's id (aggregate), the event's id, or the tenant id."
    list_per_page = 100
    show_full_result_count = False
    fields = (
        "id",
        "event_id",
        "event_type",
        "tenant_id",
        "aggregate_id",
        "created_at",
        "published_at",
        "lag",
        "attempts",
        "next_attempt_at",
        "locked_until",
        "last_error",
        "envelope",
    )
    readonly_fields = fields
    actions = ["publish_again"]

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(tenant_id=term)
        try:
            value = uuid.UUID(term)
            condition |= Q(aggregate_id=value) | Q(event_id=value)
        except ValueError:
            pass
        return queryset.filter(condition), False

    @admin.display(description="call")
    def aggregate_short(self, obj: OutboxEvent) -> str:
        return short_id(obj.aggregate_id)

    @admin.display(description="lag")
    def lag(self, obj: OutboxEvent) -> str:
        """createdAt -> publishedAt; for an unpublished event, how long it has waited so far."""
        if obj.published_at is not None:
            return f"{(obj.published_at - obj.created_at).total_seconds() * 1000:.0f} ms"
        waited = (utcnow() - obj.created_at).total_seconds()
        return format_html('<span style="color:#875800">waiting {} s</span>', f"{waited:.1f}")

    @admin.display(description="last error")
    def last_error_short(self, obj: OutboxEvent) -> str:
        return (obj.last_error[:80] + "…") if len(obj.last_error) > 80 else (obj.last_error or "—")

    @admin.display(description="envelope")
    def envelope(self, obj: OutboxEvent) -> str:
        return format_html(
            '<pre style="white-space:pre-wrap;margin:0">{}</pre>',
            display_json(obj.event_payload),
        )

    def has_publish_again_permission(self, request) -> bool:
        return request.user.has_perm("outbox.change_outboxevent")

    @admin.action(description="Publish again", permissions=["publish_again"])
    def publish_again(self, request, queryset):
        count = outbox_publish_again(ids=list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{count} event(s) will be published again.", messages.SUCCESS)
