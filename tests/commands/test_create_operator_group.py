"""manage.py create_operator_group"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission

from tenants.services import OPERATOR_GROUP, OPERATOR_PERMISSIONS, operator_group_sync
from tests.commands.cli import call, run_manage
from tests.support.factories import make_user


def _granted() -> set[str]:
    group = Group.objects.get(name=OPERATOR_GROUP)
    return {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}


@pytest.mark.django_db
def test_it_creates_the_group_with_the_operator_permissions():
    result = call("create_operator_group")
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        f"Created group Operators with {len(OPERATOR_PERMISSIONS)} permissions:",
        *(f"  {name}" for name in OPERATOR_PERMISSIONS),
    ]
    assert _granted() == set(OPERATOR_PERMISSIONS)


@pytest.mark.django_db
def test_the_permissions_view_everything_and_change_only_what_an_operator_runs():
    changes = {name for name in OPERATOR_PERMISSIONS if ".view_" not in name}
    assert changes == {
        "tenants.change_apikey",
        "orchestration.add_servicecall",
        "orchestration.change_servicecall",
        "schedules.change_schedule",
        "outbox.change_outboxevent",
        "delivery.change_subscription",
        "delivery.change_notification",
    }
    assert not any(".delete_" in name for name in OPERATOR_PERMISSIONS)
    # Nothing of auth, django-q2 or axes: those admins are superusers' only anyway.
    assert {name.split(".")[0] for name in OPERATOR_PERMISSIONS} == {
        "tenants",
        "orchestration",
        "schedules",
        "timer",
        "execution",
        "outbox",
        "delivery",
        "workers",
    }


@pytest.mark.django_db
def test_running_it_again_changes_nothing():
    call("create_operator_group")
    make_user("op", is_staff=True).groups.add(Group.objects.get(name=OPERATOR_GROUP))
    result = call("create_operator_group")
    assert result.code == 0
    assert result.out == (
        f"Group Operators is up to date ({len(OPERATOR_PERMISSIONS)} permissions, 1 member); nothing changed.\n"
    )
    assert Group.objects.filter(name=OPERATOR_GROUP).count() == 1


@pytest.mark.django_db
def test_it_sets_a_changed_group_back_and_says_what_changed():
    group, _, _ = operator_group_sync()
    group.permissions.remove(Permission.objects.get(codename="view_looprun"))
    group.permissions.add(Permission.objects.get(codename="delete_servicecall"))
    result = call("create_operator_group")
    assert result.code == 0
    assert result.out.splitlines() == [
        "Updated group Operators (0 members):",
        "  + workers.view_looprun",
        "  - orchestration.delete_servicecall",
    ]
    assert _granted() == set(OPERATOR_PERMISSIONS)


@pytest.mark.django_db
def test_it_refuses_when_a_permission_is_missing_and_stores_nothing():
    Permission.objects.filter(codename="view_looprun").delete()
    result = call("create_operator_group")
    assert result.code == 1
    assert result.err == "Permission(s) workers.view_looprun do not exist yet: run manage.py migrate first."
    assert not Group.objects.filter(name=OPERATOR_GROUP).exists()


@pytest.mark.django_db(transaction=True)
def test_help_says_it_is_safe_to_run_again():
    result = run_manage("create_operator_group", "--help")
    assert result.code == 0
    assert "Safe to run again" in result.out and "docs/operations.md" in result.out
