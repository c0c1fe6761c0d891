"""The admins of apps that are not the product's (auth, django-q2, axes): superusers only.

Their rows belong to no tenant, so the tenant scoping of tenants.admin cannot apply, and each
would let a permission reach past it: django-q2's Schedule runs any importable function in the
workers, its task pages show every tenant's ids (task arguments), auth's User and Group admins
grant superuser status and permissions, axes' pages list every tenant's usernames. However an
operator hands out permissions ("select all" included), non-superuser staff are refused there,
and the apps do not appear on their admin index (docs/security.md §5).

django-q2's admins are read-only even for superusers: this product creates no django-q2
schedules and enqueues its tasks in code, so adding or changing one in the admin is never
needed, and "Resubmit" runs a stored function again (a failed call is run again with "Run
again" on the call). Deleting stays, for superusers: it runs nothing, and it is how a schedule
that should not exist is removed.
"""

from __future__ import annotations

# Importing the other apps' admin modules registers their admins now. INSTALLED_APPS lists our
# apps first and autodiscover imports each app's admin module in that order, so without these
# imports auth, django-q2 and axes would register theirs after this module runs; with them the
# order does not matter (a module runs once: autodiscover's later import finds it done).
import axes.admin  # noqa: F401
import django.contrib.auth.admin  # noqa: F401
import django_q.admin  # noqa: F401
from django.contrib import admin


class SuperuserOnlyMixin:
    """Every permission check also requires a superuser; the app's own rules apply on top."""

    def has_module_permission(self, request):
        return request.user.is_superuser and super().has_module_permission(request)

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_view_permission(request, obj)

    def has_add_permission(self, request, *args):
        return request.user.is_superuser and super().has_add_permission(request, *args)

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_delete_permission(request, obj)


class TaskQueueReadOnlyMixin(SuperuserOnlyMixin):
    """django-q2's records: superusers read and delete them; nobody adds, edits or resubmits."""

    actions = ()

    def has_add_permission(self, request, *args):
        return False

    def has_change_permission(self, request, obj=None):
        return False


# The apps whose admins are the product's: scoped by tenants.admin, or holding no tenant's data.
PRODUCT_APPS = frozenset(
    {"tenants", "orchestration", "timer", "execution", "outbox", "delivery", "schedules", "workers", "eventservice"}
)


def _superusers_only() -> None:
    # Every admin registered so far that is not the product's: auth's, django-q2's and axes'
    # (imported above), whatever they are (axes registers its admins only with AXES_ENABLE_ADMIN,
    # django-q2 its queue admin only with the ORM broker). An app whose admin registers later
    # is caught by tests/admin/test_admin_scoping.py.
    for model, model_admin in list(admin.site._registry.items()):
        if model._meta.app_label in PRODUCT_APPS or isinstance(model_admin, SuperuserOnlyMixin):
            continue
        mixin = TaskQueueReadOnlyMixin if model._meta.app_label == "django_q" else SuperuserOnlyMixin
        base = type(model_admin)
        admin.site.unregister(model)
        admin.site.register(model, type(base.__name__, (mixin, base), {"__module__": __name__}))


_superusers_only()
