"""Operator admin of event delivery (docs/events.md): subscriptions, operator-wide ones
included, and notifications with their attempts.

Changes go through delivery.services: a subscription is created by subscription_create (a
webhook's new secret is shown once, in a message) and changed by subscription_update, after
delivery.validation checked the input as an operator's; notifications are read-only, with the
actions "Resend now" and "Recover". Sealed secrets are never displayed.

Scoped like every product admin (tenants.admin): non-superuser staff see their tenants'
subscriptions and those subscriptions' notifications; operator-wide subscriptions (no tenant)
and their notifications are superusers' only.
"""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Q
from django.utils.html import format_html

from core.admin import ShownOnceMixin
from core.errors import NotFound, ValidationFailed
from core.ids import short_id
from core.rendering import display_json
from delivery.channels import DEFAULT_KIND, channel_for, channels
from delivery.models import DeliveryAttempt, Notification, Subscription
from delivery.services import (
    notification_resend,
    subscription_create,
    subscription_delete,
    subscription_update,
)
from delivery.validation import EVENT_TYPES, SubscriptionInput, validate_subscription
from outbox.admin import TenantIdFilter
from tenants.admin import ReadOnlyAdmin, ReadOnlyInline, TenantScopedAdmin, visible_tenant_ids
from tenants.selectors import tenant_ceilings_get

# delivery.validation's wire names -> the admin form's fields (a channel's own: its column).
WIRE_FIELDS = {
    "kind": "kind",
    "name": "name",
    **{field.wire: field.column for channel in channels() for field in channel.fields},
    "eventTypes": "event_types",
    "tags": "tags",
    "enabled": "enabled",
}


def _channel_fields(*, operator: bool) -> tuple[str, ...]:
    """The form fields of the channels' own fields: every kind's for an operator, the kinds a
    tenant may make otherwise (delivery.validation's rule)."""
    return tuple(
        field.column for channel in channels() if operator or not channel.operator_only for field in channel.fields
    )


class SubscriptionAdminForm(forms.ModelForm):
    """Parses the admin's form; the rules are delivery.validation's (as an operator's). Name,
    event types and each channel's own fields (a webhook's URL, a NATS subject template: below
    the class) are the form's own fields, so the model's checks do not repeat validation's
    messages in other words."""

    name = forms.CharField(required=False, strip=False)
    event_types = forms.MultipleChoiceField(
        choices=[(event_type, event_type) for event_type in EVENT_TYPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None checked: every event type.",
    )
    tags = forms.CharField(
        label="Call tags",
        required=False,
        help_text="Space-separated: only the events of calls carrying one of these tags. Empty: every call's.",
    )
    # Set by SubscriptionAdmin.get_form: whether this user may make an operator-wide one, and
    # whether the input is checked as an operator's (NATS, subject templates: superusers only; a
    # subject template may publish onto any tenant's subjects).
    operator_wide_allowed = False
    operator = False

    class Meta:
        model = Subscription
        fields = ("tenant", "kind", "enabled")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.instance._state.adding:
            self.fields["name"].initial = self.instance.name
            for column in _channel_fields(operator=True):
                if column in self.fields:  # an operator-only kind's are read-only for staff
                    self.fields[column].initial = getattr(self.instance, column)
            self.fields["event_types"].initial = list(self.instance.event_types or [])
            self.fields["tags"].initial = " ".join(self.instance.tags or [])
        if "kind" in self.fields:
            self.fields["kind"].initial = DEFAULT_KIND
        if "tenant" in self.fields:
            self.fields["tenant"].required = not self.operator_wide_allowed
            self.fields["tenant"].help_text = (
                "Blank: operator-wide, every tenant's events." if self.operator_wide_allowed else ""
            )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        adding = self.instance._state.adding
        kind = cleaned.get("kind") if adding else self.instance.kind
        data: dict[str, Any] = {
            "name": cleaned.get("name") or "",
            "eventTypes": list(cleaned.get("event_types") or []),
            "tags": (cleaned.get("tags") or "").split(),
            "enabled": bool(cleaned.get("enabled")),
        }
        if adding:
            data["kind"] = kind or ""
            tenant = cleaned.get("tenant")
            limit = tenant_ceilings_get(tenant_id=tenant.pk).subscriptions if tenant is not None else 0
            if tenant is not None and Subscription.objects.filter(tenant=tenant).count() >= limit:
                # subscription_create checks it again, in its transaction.
                self.add_error(
                    "tenant",
                    f"A tenant may have at most {limit} subscriptions (the operator's ceiling for this tenant).",
                )
        for channel in channels():
            data.update(channel.admin_data(cleaned, kind=kind, adding=adding))
        try:
            self.subscription_input: SubscriptionInput = validate_subscription(
                data, partial=not adding, operator=self.operator
            )
        except ValidationFailed as exc:
            for wire_name, field_messages in exc.errors.items():
                field = WIRE_FIELDS.get(wire_name)
                for message in field_messages:
                    if field is None or message not in self.errors.get(field, []):
                        self.add_error(field if field in self.fields else None, message)
        return cleaned


# Each channel's own fields, declared as if written in the class body (delivery/channels/).
for _column, _field in ((f.column, f.admin_field()) for c in channels() for f in c.fields):
    SubscriptionAdminForm.base_fields[_column] = SubscriptionAdminForm.declared_fields[_column] = _field


# A target's characters a list shows (the whole of it on hover, and on the subscription's page).
TARGET_SHOWN = 48


@admin.register(Subscription)
class SubscriptionAdmin(ShownOnceMixin, TenantScopedAdmin):
    form = SubscriptionAdminForm
    list_display = (
        "name",
        "tenant_display",
        "kind",
        "target",
        "event_types_display",
        "enabled",
        "failing_since",
        "last_success_at",
    )
    list_filter = ("kind", "enabled", ("tenant", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("tenant",)
    search_fields = ("name", "url")
    ordering = ("-created_at",)

    def get_fields(self, request, obj=None):
        if obj is None:
            # Staff: the kinds tenants make only (SubscriptionAdminForm.operator).
            own = _channel_fields(operator=request.user.is_superuser)
            return ("tenant", "kind", "name", *own, "event_types", "tags", "enabled")
        return (
            "tenant_display",
            "kind",
            "name",
            *(field.column for field in channel_for(obj.kind).fields),
            "event_types",
            "tags",
            "enabled",
            "disabled_reason",
            "failing_since",
            "last_success_at",
            "signing_secret",
            "created_at",
            "updated_at",
        )

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        # Staff see an operator-only kind's fields (a NATS subject template), and change them only
        # as superusers.
        operator_only = tuple(
            field.column for channel in channels() if channel.operator_only for field in channel.fields
        )
        return (
            *(() if request.user.is_superuser else operator_only),
            "tenant_display",
            "kind",
            "disabled_reason",
            "failing_since",
            "last_success_at",
            "signing_secret",
            "created_at",
            "updated_at",
        )

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.operator_wide_allowed = visible_tenant_ids(request) is None
        form.operator = request.user.is_superuser
        return form

    @admin.display(description="tenant", ordering="tenant")
    def tenant_display(self, obj: Subscription) -> str:
        return obj.tenant_id or "— operator-wide —"

    @admin.display(description=" or ".join(channel.target_label for channel in channels()))
    def target(self, obj: Subscription) -> str:
        shown = channel_for(obj.kind).target(obj)
        if len(shown) <= TARGET_SHOWN:
            return shown
        return format_html('<span title="{}">{}…</span>', shown, shown[: TARGET_SHOWN - 1])

    @admin.display(description="event types")
    def event_types_display(self, obj: Subscription) -> str:
        return ", ".join(obj.event_types) if obj.event_types else "all"

    @admin.display(description="signing secret")
    def signing_secret(self, obj: Subscription) -> str:
        # Whether there is one, never the secret: it was shown once, when it was made.
        if not channel_for(obj.kind).signs:
            return "—"
        if obj.previous_secret_until:
            return f"set (whsec_…, shown once); the previous one signs too until {obj.previous_secret_until:%Y-%m-%d %H:%M} UTC"
        return "set (whsec_…, shown once)"

    def save_model(self, request, obj, form, change):
        data = form.subscription_input
        if change:
            saved = subscription_update(tenant_id=obj.tenant_id, subscription_id=obj.pk, data=data)
        else:
            saved, secret = subscription_create(tenant_id=obj.tenant_id, data=data)
            if secret:
                # The secret exists only in this response (response_add); stored, it is sealed.
                request.shown_once = secret
        for field in Subscription._meta.concrete_fields:
            setattr(obj, field.attname, getattr(saved, field.attname))
        obj._state.adding = False

    def shown_once_title(self, obj) -> str:
        return f"Signing secret of “{obj.name}”"

    def get_deleted_objects(self, objs, request):
        # A subscription's notifications and attempts go with it (subscription_delete): counted,
        # not listed (there may be many), and they need no delete permission of their own.
        subscriptions = list(objs)
        counts = {
            Subscription._meta.verbose_name_plural: len(subscriptions),
            Notification._meta.verbose_name_plural: Notification.objects.filter(subscription__in=subscriptions).count(),
            DeliveryAttempt._meta.verbose_name_plural: DeliveryAttempt.objects.filter(
                notification__subscription__in=subscriptions
            ).count(),
        }
        return [str(subscription) for subscription in subscriptions], counts, set(), []

    def delete_model(self, request, obj):
        subscription_delete(tenant_id=obj.tenant_id, subscription_id=obj.pk)

    def delete_queryset(self, request, queryset):
        for tenant_id, subscription_id in queryset.values_list("tenant_id", "pk"):
            try:
                subscription_delete(tenant_id=tenant_id, subscription_id=subscription_id)
            except NotFound:  # deleted meanwhile
                continue


class DeliveryAttemptInline(ReadOnlyInline):
    model = DeliveryAttempt
    fields = ("n", "trigger", "started_at", "latency_ms", "status_code", "response_snippet", "error")
    readonly_fields = fields
    verbose_name_plural = "attempts"


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    # A notification belongs to its subscription's tenant: an operator-wide subscription's
    # notifications carry tenants' events but are the operator's.
    tenant_lookup = "subscription__tenant_id"
    list_display = (
        "event_type",
        "event_short",
        "tenant_id",
        "subscription",
        "kind",
        "state",
        "attempts",
        "next_attempt_at",
        "delivered_at",
        "created_at",
        "last_error_short",
    )
    list_filter = ("state", "subscription__kind", TenantIdFilter, ("created_at", admin.DateFieldListFilter))
    list_select_related = ("subscription",)
    search_fields = ("tenant_id",)
    search_help_text = "An event's id or a call's id (aggregate), a delivery's id, or a tenant id."
    list_per_page = 100
    show_full_result_count = False
    # Ids are time-ordered (UUID v7): newest first, along the primary key.
    ordering = ("-notification_id",)
    fields = (
        "notification_id",
        "subscription",
        "tenant_id",
        "event_type",
        "event_id",
        "aggregate_id",
        "event_seq",
        "event_created_at",
        "state",
        "attempts",
        "step",
        "next_attempt_at",
        "manual",
        "locked_until",
        "claimed_by",
        "delivered_at",
        "last_error",
        "created_at",
        "updated_at",
        "envelope_display",
    )
    readonly_fields = fields
    inlines = [DeliveryAttemptInline]
    actions = ["resend_now", "recover"]

    def has_resend_permission(self, request) -> bool:
        return request.user.has_perm("delivery.change_notification")

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(tenant_id=term)
        try:
            value = uuid.UUID(term)
            condition |= Q(event_id=value) | Q(aggregate_id=value) | Q(notification_id=value)
        except ValueError:
            pass
        return queryset.filter(condition), False

    @admin.display(description="event")
    def event_short(self, obj: Notification) -> str:
        return short_id(obj.event_id)

    @admin.display(description="kind", ordering="subscription__kind")
    def kind(self, obj: Notification) -> str:
        return obj.subscription.kind

    @admin.display(description="last error")
    def last_error_short(self, obj: Notification) -> str:
        return (obj.last_error[:80] + "…") if len(obj.last_error) > 80 else (obj.last_error or "—")

    @admin.display(description="envelope")
    def envelope_display(self, obj: Notification) -> str:
        return format_html('<pre class="readonly">{}</pre>', display_json(obj.envelope))

    def _resend(self, queryset, *, states: tuple[str, ...] | None) -> int:
        count = 0
        rows = queryset if states is None else queryset.filter(state__in=states)
        for notification_id, tenant_id in rows.values_list("pk", "subscription__tenant_id"):
            try:
                notification_resend(tenant_id=tenant_id, notification_id=notification_id)
            except NotFound:  # its subscription was deleted meanwhile
                continue
            count += 1
        return count

    @admin.action(description="Resend now", permissions=["resend"])
    def resend_now(self, request, queryset):
        count = self._resend(queryset, states=None)
        self.message_user(request, f"{count} notification(s) will be sent again now.", messages.SUCCESS)

    @admin.action(description="Recover (requeue failed/expired)", permissions=["resend"])
    def recover(self, request, queryset):
        count = self._resend(queryset, states=(Notification.State.FAILED, Notification.State.EXPIRED))
        skipped = queryset.count() - count
        note = f"; {skipped} neither failed nor expired, left as they are" if skipped else ""
        self.message_user(request, f"{count} notification(s) requeued{note}.", messages.SUCCESS)
