"""Writes of the tenants module: tenants, memberships, API keys."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction

from core.errors import Conflict, NotFound, ValidationFailed
from tenants.models import ApiKey, Membership, Tenant, TenantCeilings, tenant_slug_validator

KEY_PREFIX = "sa_"


def hash_api_key(raw_key: str) -> str:
    # Keys carry 256 bits of randomness, so a fast hash is enough (no brute force possible).
    return hashlib.sha256(raw_key.encode()).hexdigest()


def tenant_create(*, slug: str, name: str = "") -> Tenant:
    try:
        tenant_slug_validator(slug)
    except ValidationError as exc:
        raise ValidationFailed({"tenant": exc.messages}) from None
    if len(name) > 200:
        raise ValidationFailed({"name": ["A tenant name is at most 200 characters."]})
    if Tenant.objects.filter(id=slug).exists():
        raise ValidationFailed({"tenant": [f"Tenant {slug!r} already exists."]})
    return Tenant.objects.create(id=slug, name=name or slug)


def api_key_create(*, tenant_id: str, label: str = "") -> tuple[ApiKey, str]:
    """Create a key and return it with the raw key, which is never stored."""
    if not Tenant.objects.filter(id=tenant_id).exists():
        raise NotFound(f"Tenant {tenant_id!r} does not exist.")
    if len(label) > 200:
        raise ValidationFailed({"label": ["A key label is at most 200 characters."]})
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(tenant_id=tenant_id, label=label, prefix=raw[:10], key_hash=hash_api_key(raw))
    return key, raw


@transaction.atomic
def membership_add(*, username: str, tenant_id: str, role: str = Membership.Role.MEMBER) -> Membership:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"User {username!r} does not exist.")
    if not Tenant.objects.filter(id=tenant_id).exists():
        raise NotFound(f"Tenant {tenant_id!r} does not exist.")
    if role not in Membership.Role.values:
        raise ValidationFailed({"role": [f"Role must be one of {', '.join(Membership.Role.values)}."]})
    membership, _ = Membership.objects.update_or_create(tenant_id=tenant_id, user=user, defaults={"role": role})
    return membership


def api_key_revoke(*, key_ids: list[int], tenant_ids: set[str] | None = None) -> int:
    """Revoke keys (once: a revoked key keeps its first revocation time); returns how many."""
    from django.utils import timezone

    from tenants.selectors import api_key_forget

    keys = ApiKey.objects.filter(pk__in=list(key_ids), revoked_at__isnull=True)
    if tenant_ids is not None:
        keys = keys.filter(tenant_id__in=list(tenant_ids))
    hashes = list(keys.values_list("key_hash", flat=True))
    revoked = keys.update(revoked_at=timezone.now())
    for key_hash in hashes:  # refused at once here; other processes within API_KEY_CACHE_SECONDS
        api_key_forget(key_hash=key_hash)
    return revoked


# A key's last use is recorded at most this often: a write per API request would cost the hot path.
API_KEY_TOUCH_SECONDS = 60


def api_key_touch(*, api_key: ApiKey) -> None:
    """Record that `api_key` was used now (at most once a minute per key)."""
    from django.utils import timezone

    from tenants.selectors import api_key_forget

    now = timezone.now()
    if api_key.last_used_at is not None and (now - api_key.last_used_at).total_seconds() <= API_KEY_TOUCH_SECONDS:
        return
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
    api_key.last_used_at = now
    # The remembered row holds the old time: the next lookup reads the new one.
    api_key_forget(key_hash=api_key.key_hash)


# --- People: accounts and the Operators group ---------------------------------------------------
# Django's auth tables belong to no app of ours; who may see which tenant is this module's
# business (memberships, tenants.admin's scoping), so the accounts made from the shell and the
# operators' group are written here (docs/operations.md).

OPERATOR_GROUP = "Operators"
# What an operator does in the admin, for the tenants they are members of (docs/operations.md,
# "The Operators group"): read every page of the product, and the few actions of running it.
# Nothing is added or deleted; tenants, memberships, keys and subscriptions are made from the
# shell or the API. Every product admin is tenant-scoped (docs/security.md#5-tenant-isolation).
OPERATOR_PERMISSIONS: tuple[str, ...] = (
    "tenants.view_tenant",
    "tenants.view_membership",
    "tenants.view_apikey",
    "tenants.change_apikey",  # "Revoke selected API keys" (and a key's label)
    "orchestration.view_servicecall",
    "orchestration.add_servicecall",  # "Run again": it submits a new call
    "orchestration.change_servicecall",  # "Cancel" (Scheduled calls only)
    "orchestration.view_flowcontrol",  # limits are set by the tenant (API, settings page) or a superuser
    "tenants.view_tenantceilings",  # set by a superuser (admin, set_tenant_ceilings)
    "schedules.view_schedule",
    "schedules.change_schedule",  # "Pause", "Resume"
    "timer.view_timerschedule",
    "execution.view_httpexecution",
    "outbox.view_outboxevent",
    "outbox.change_outboxevent",  # "Publish again"
    "delivery.view_subscription",
    "delivery.change_subscription",  # turn a disabled subscription back on, fix its URL
    "delivery.view_notification",
    "delivery.change_notification",  # "Resend now", "Recover"
    "workers.view_workersession",
    "workers.view_looprun",
)


def _operator_permissions():
    from django.contrib.auth.models import Permission

    wanted = {tuple(name.split(".", 1)) for name in OPERATOR_PERMISSIONS}
    found = {
        (permission.content_type.app_label, permission.codename): permission
        for permission in Permission.objects.select_related("content_type").filter(
            codename__in=[codename for _, codename in wanted]
        )
        if (permission.content_type.app_label, permission.codename) in wanted
    }
    missing = sorted(f"{app}.{codename}" for app, codename in wanted - found.keys())
    if missing:
        # Django creates permissions after migrating (post_migrate): a database that was never
        # migrated by this version of the code lacks them.
        raise NotFound(f"Permission(s) {', '.join(missing)} do not exist yet: run manage.py migrate first.")
    return list(found.values())


@transaction.atomic
def operator_group_sync() -> tuple[object, list[str], list[str]]:
    """Create the Operators group, or set its permissions to exactly OPERATOR_PERMISSIONS.
    Returns the group and the permissions added and removed ("app.codename", sorted)."""
    from django.contrib.auth.models import Group

    permissions = _operator_permissions()
    group, _ = Group.objects.get_or_create(name=OPERATOR_GROUP)
    before = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}
    group.permissions.set(permissions)
    after = set(OPERATOR_PERMISSIONS)
    return group, sorted(after - before), sorted(before - after)


def operator_group_get():
    """The Operators group; created with OPERATOR_PERMISSIONS when missing, else as it is (a
    superuser may have changed it; operator_group_sync sets it back)."""
    from django.contrib.auth.models import Group

    group = Group.objects.filter(name=OPERATOR_GROUP).first()
    if group is None:
        group, _, _ = operator_group_sync()
    return group


@transaction.atomic
def user_create(
    *,
    username: str,
    password: str,
    email: str = "",
    is_staff: bool = False,
    operator: bool = False,
    tenant_ids: list[str] | tuple[str, ...] = (),
    role: str = Membership.Role.MEMBER,
):
    """Create a login, optionally staff, an operator (staff in the Operators group) and a member
    of tenants. Every input is checked first, the password by AUTH_PASSWORD_VALIDATORS: on any
    error nothing is stored."""
    from django.contrib.auth import password_validation

    user_model = get_user_model()
    errors: dict[str, list[str]] = {}
    username_field = user_model._meta.get_field(user_model.USERNAME_FIELD)
    try:
        username_field.clean(username, None)
    except ValidationError as exc:
        errors["username"] = exc.messages
    else:
        if user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).exists():
            raise Conflict(f"User {username!r} already exists.")
    if email:
        try:
            user_model._meta.get_field("email").clean(email, None)
        except ValidationError as exc:
            errors["email"] = exc.messages
    try:
        password_validation.validate_password(password, user=user_model(username=username, email=email))
    except ValidationError as exc:
        errors["password"] = exc.messages
    unknown = [tenant_id for tenant_id in dict.fromkeys(tenant_ids) if not Tenant.objects.filter(id=tenant_id).exists()]
    if unknown:
        errors["tenant"] = [f"Tenant {tenant_id!r} does not exist." for tenant_id in unknown]
    if role not in Membership.Role.values:
        errors["role"] = [f"Role must be one of {', '.join(Membership.Role.values)}."]
    if errors:
        raise ValidationFailed(errors)
    group = operator_group_get() if operator else None
    user = user_model._default_manager.create_user(
        username, email=email, password=password, is_staff=is_staff or operator
    )
    if group is not None:
        user.groups.add(group)
    for tenant_id in dict.fromkeys(tenant_ids):
        membership_add(username=username, tenant_id=tenant_id, role=role)
    return user


# --- Operator ceilings (docs/flow-control.md, "Operator ceilings") -----------------------------------


@transaction.atomic
def tenant_ceilings_set(*, tenant_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Set some of the tenant's ceilings: `changes` as tenants.ceilings.validate_ceilings gives
    them ({column: value, or None for the default}); the others stay. Every default again
    removes the row. Returns the operator's own values by wire name. A ceiling lowered below
    the tenant's own flow-control limit wins at once (the effective limit is the lower);
    other processes apply a change within tenants.selectors.CEILINGS_CACHE_SECONDS."""
    from tenants.ceilings import BOUNDS
    from tenants.selectors import ceilings_forget, tenant_ceilings_stored

    if not Tenant.objects.filter(id=tenant_id).exists():
        raise NotFound(f"Tenant {tenant_id!r} does not exist.")
    unknown = set(changes) - {bound.column for bound in BOUNDS}
    if unknown:
        raise ValidationFailed({"body": [f"Unknown ceilings: {', '.join(sorted(unknown))}."]})
    row = TenantCeilings.objects.select_for_update().filter(pk=tenant_id).first() or TenantCeilings(tenant_id=tenant_id)
    for column, value in changes.items():
        setattr(row, column, value)
    if all(getattr(row, bound.column) is None for bound in BOUNDS):
        if row.pk is not None and not row._state.adding:
            row.delete()
    else:
        row.save()
    transaction.on_commit(ceilings_forget)
    ceilings_forget()
    return tenant_ceilings_stored(tenant_id=tenant_id)
