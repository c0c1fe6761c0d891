"""manage.py add_member <username> <tenant> [--role owner|member]"""

import pytest

from tenants.models import Membership
from tests.commands.cli import call, run_manage
from tests.support.factories import make_user


def _role(username: str, tenant: str) -> str | None:
    return Membership.objects.filter(user__username=username, tenant_id=tenant).values_list("role", flat=True).first()


def test_it_adds_a_member_with_the_default_role(world):
    result = call("add_member", "outsider", "acme")
    assert result.code == 0
    assert result.out.strip() == "Added outsider to tenant acme as member."
    assert _role("outsider", "acme") == "member"


def test_it_adds_an_owner(world):
    assert call("add_member", "outsider", "acme", "--role", "owner").code == 0
    assert _role("outsider", "acme") == "owner"


def test_running_it_again_changes_the_role(world):
    result = call("add_member", "member", "acme", "--role", "owner")
    assert result.code == 0
    assert "from member to owner" in result.out
    assert _role("member", "acme") == "owner"
    assert "nothing changed" in call("add_member", "member", "acme", "--role", "owner").out


def test_it_refuses_an_unknown_user(world):
    result = call("add_member", "nobody", "acme")
    assert result.code == 1
    assert "User 'nobody' does not exist." in result.err
    assert not Membership.objects.filter(user__username="nobody").exists()


def test_it_refuses_an_unknown_tenant(world):
    before = Membership.objects.count()
    result = call("add_member", "outsider", "initech")
    assert result.code == 1
    assert "Tenant 'initech' does not exist" in result.err
    assert Membership.objects.count() == before


@pytest.mark.django_db(transaction=True)
def test_from_the_command_line_a_bad_role_exits_non_zero(db):
    make_user("someone", password="pw-some-123")
    result = run_manage("add_member", "someone", "acme", "--role", "admin")
    assert result.code == 2
    assert "invalid choice: 'admin'" in result.err


@pytest.mark.django_db(transaction=True)
def test_help_explains_the_arguments():
    result = run_manage("add_member", "--help")
    assert result.code == 0
    assert "--role {owner,member}" in result.out
    assert "username" in result.out and "tenant" in result.out
