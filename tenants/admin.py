"""Operator admin of tenants, memberships and API keys, and the tenant scoping every admin uses.

Superusers see every tenant. Other staff see only the tenants they are members of: lists are
filtered in get_queryset, tenant and user choices in forms are limited, and objects of other
tenants can be neither viewed nor changed (docs/security.md §5). Admins of apps that are not
the product's are superusers' only: eventservice/admin.py.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import Count

from core.admin import ShownOnceMixin
from core.errors import ValidationFailed
from tenants.ceilings import BOUNDS, BY_NAME, validate_ceilings
from tenants.models import ApiKey, Membership, Tenant, TenantCeilings
from tenants.selectors import tenant_ids_for_user
from tenants.services import api_key_create, api_key_revoke, membership_add, tenant_ceilings_set, tenant_create

admin.site.site_header = "Service Agent administration"
admin.site.site_title = "Service Agent admin"
admin.site.index_title = "Operations"
admin.site.site_url = "/calls/"
# The lists get the window's width (the index and the breadcrumbs lead everywhere).
admin.site.enable_nav_sidebar = False


def visible_tenant_ids(request) -> set[str] | None:
    """The tenants this staff user may see in the admin; None means all (superuser)."""
    if request.user.is_superuser:
        return None
    if not hasattr(request, "_admin_tenant_ids"):
        request._admin_tenant_ids = tenant_ids_for_user(user=request.user)
    return request._admin_tenant_ids


class TenantScopedAdmin(admin.ModelAdmin):
    """A ModelAdmin whose rows belong to a tenant, reached by `tenant_lookup`."""

    tenant_lookup = "tenant_id"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        ids = visible_tenant_ids(request)
        return queryset if ids is None else queryset.filter(**{f"{self.tenant_lookup}__in": ids})

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        ids = visible_tenant_ids(request)
        if ids is not None and db_field.related_model is Tenant:
            kwargs["queryset"] = Tenant.objects.filter(id__in=ids)
        elif ids is not None and db_field.related_model is get_user_model():
            # Accounts belong to no tenant, so the list of all of them is another tenant's data
            # (its people). Staff choose among the people of their own tenants; bringing in
            # someone new (creating an account) is a superuser's job.
            kwargs["queryset"] = (
                get_user_model().objects.filter(memberships__tenant_id__in=ids).distinct().order_by("username")
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def owns(self, request, obj) -> bool:
        ids = visible_tenant_ids(request)
        if ids is None or obj is None:
            return True
        value = obj
        for part in self.tenant_lookup.split("__"):
            value = getattr(value, part)
        return value in ids

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) and self.owns(request, obj)

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and self.owns(request, obj)

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and self.owns(request, obj)


class ReadOnlyMixin:
    """Domain state: shown, never edited here (changes go through the modules' services)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(ReadOnlyMixin, TenantScopedAdmin):
    pass


class ReadOnlyInline(ReadOnlyMixin, admin.TabularInline):
    """A read-only part of an object; whoever may view the object may view its parts."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_view_permission(self, request, obj=None):
        return True


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ("user", "role", "created_at")
    readonly_fields = ("user", "created_at")
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    tenant_lookup = "id"
    list_display = ("id", "name", "member_count", "key_count", "created_at")
    # The counts' GROUP BY drops Meta.ordering; lists and autocomplete pages need an order.
    ordering = ("id",)
    search_fields = ("id", "name")
    readonly_fields = ("created_at",)
    inlines = [MembershipInline]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(_members=Count("memberships", distinct=True), _keys=Count("api_keys", distinct=True))
        )

    @admin.display(description="members", ordering="_members")
    def member_count(self, obj: Tenant) -> int:
        return obj._members

    @admin.display(description="API keys", ordering="_keys")
    def key_count(self, obj: Tenant) -> int:
        return obj._keys

    def get_readonly_fields(self, request, obj=None):
        # A tenant's id is in every row and event: it never changes.
        return ("id", "created_at") if obj is not None else ("created_at",)

    def has_add_permission(self, request):
        # A new tenant would belong to nobody a non-superuser could see.
        return request.user.is_superuser and super().has_add_permission(request)

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        created = tenant_create(slug=obj.id, name=obj.name)
        obj.created_at = created.created_at


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    list_display = ("user", "tenant", "role", "created_at")
    list_filter = ("role", ("tenant", admin.RelatedOnlyFieldListFilter))
    search_fields = ("user__username", "tenant__id")
    list_select_related = ("user", "tenant")
    autocomplete_fields = ()

    def get_readonly_fields(self, request, obj=None):
        return ("user", "tenant", "created_at") if obj is not None else ("created_at",)

    def save_model(self, request, obj, form, change):
        saved = membership_add(username=obj.user.get_username(), tenant_id=obj.tenant_id, role=obj.role)
        obj.pk = saved.pk
        obj.created_at = saved.created_at


@admin.register(ApiKey)
class ApiKeyAdmin(ShownOnceMixin, TenantScopedAdmin):
    list_display = ("prefix_display", "label", "tenant", "created_at", "last_used_at", "revoked_at")
    list_filter = (("tenant", admin.RelatedOnlyFieldListFilter), ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("label", "prefix", "tenant__id")
    actions = ["revoke"]

    @admin.display(description="key", ordering="prefix")
    def prefix_display(self, obj: ApiKey) -> str:
        return f"{obj.prefix}…"

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("tenant", "label")
        return ("tenant", "label", "prefix_display", "created_at", "last_used_at", "revoked_at")

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("tenant", "prefix_display", "created_at", "last_used_at", "revoked_at")

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        key, raw = api_key_create(tenant_id=obj.tenant_id, label=obj.label)
        for field in ("pk", "prefix", "key_hash", "created_at"):
            setattr(obj, field, getattr(key, field))
        # The raw key exists only in this response (response_add); it is not stored anywhere.
        request.shown_once = raw

    def shown_once_title(self, obj) -> str:
        return f"New API key for tenant {obj.tenant_id}"

    @admin.action(description="Revoke selected API keys", permissions=["change"])
    def revoke(self, request, queryset):
        count = api_key_revoke(
            key_ids=list(queryset.values_list("pk", flat=True)), tenant_ids=visible_tenant_ids(request)
        )
        self.message_user(request, f"Revoked {count} API key(s).", messages.SUCCESS)


class TenantCeilingsForm(forms.ModelForm):
    """The ceilings as the command takes them, checked by tenants.ceilings.validate_ceilings: an
    empty field is the default setting."""

    class Meta:
        model = TenantCeilings
        fields = ["tenant", *[bound.column for bound in BOUNDS]]
        help_texts = {
            bound.column: f"{bound.meaning}: {bound.range_text}; empty: the default ({bound.setting})"
            for bound in BOUNDS
        }

    def clean(self):
        cleaned = super().clean()
        wire = {bound.name: cleaned.get(bound.column) for bound in BOUNDS if bound.column not in self.errors}
        try:
            self.changes = validate_ceilings(wire)
        except ValidationFailed as exc:
            for name, found in exc.errors.items():
                bound = BY_NAME.get(name)
                self.add_error(bound.column if bound else None, found)
        return cleaned


@admin.register(TenantCeilings)
class TenantCeilingsAdmin(TenantScopedAdmin):
    """The operator's ceilings per tenant (docs/flow-control.md, "Operator ceilings"). Staff with
    the view permission see those of their tenants; only a superuser changes them, and always
    through tenants.services.tenant_ceilings_set: a tenant's member never raises its own."""

    form = TenantCeilingsForm
    list_display = ("tenant", *[bound.column for bound in BOUNDS], "updated_at")
    readonly_fields = ("updated_at",)

    def get_readonly_fields(self, request, obj=None):
        return ("tenant", "updated_at") if obj is not None else ("updated_at",)

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser

    def save_model(self, request, obj, form, change):
        tenant_ceilings_set(tenant_id=obj.tenant_id, changes=form.changes)

    def delete_model(self, request, obj):
        tenant_ceilings_set(tenant_id=obj.tenant_id, changes={bound.column: None for bound in BOUNDS})

    def delete_queryset(self, request, queryset):
        for tenant_id in list(queryset.values_list("tenant_id", flat=True)):
            tenant_ceilings_set(tenant_id=tenant_id, changes={bound.column: None for bound in BOUNDS})
