"""manage.py create_user <username> (--password-stdin | --generate-password) [--email E] [--staff]
[--operator] [--tenant T]... [--role owner|member]"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError

from tenants.models import Membership
from tenants.services import OPERATOR_GROUP, OPERATOR_PERMISSIONS
from tests.commands.cli import Result, call, run_manage


def create_user(*args: str, stdin: str | io.StringIO | None = None) -> Result:
    """call() with a standard input for --password-stdin."""
    out, err = io.StringIO(), io.StringIO()
    given = io.StringIO(stdin) if isinstance(stdin, str) else stdin
    try:
        call_command("create_user", *args, stdout=out, stderr=err, **({"stdin": given} if given else {}))
    except CommandError as exc:
        return Result(exc.returncode, out.getvalue(), err.getvalue() + str(exc))
    return Result(0, out.getvalue(), err.getvalue())


def _user(username: str):
    return get_user_model().objects.filter(username=username).first()


def _password_is(username: str, password: str) -> bool:
    return _user(username).check_password(password)


def _memberships(username: str) -> dict[str, str]:
    return dict(Membership.objects.filter(user__username=username).values_list("tenant_id", "role"))


def test_it_creates_a_user_with_the_password_from_stdin(world):
    result = create_user("dana", "--password-stdin", "--email", "dana@example.com", stdin="pw-dana-long\n")
    assert result.code == 0, result.err
    assert result.out == "Created user dana, member of no tenant.\n"
    user = _user("dana")
    assert user.email == "dana@example.com"
    assert not user.is_staff and not user.is_superuser
    assert _password_is("dana", "pw-dana-long")
    assert "pw-dana-long" not in result.out  # never printed back


def test_only_the_first_line_of_stdin_is_the_password(world):
    assert create_user("dana", "--password-stdin", stdin="pw-dana-long\r\nsecond line\n").code == 0
    assert _password_is("dana", "pw-dana-long")


def test_a_generated_password_is_printed_once_and_works(world):
    result = create_user("dana", "--generate-password")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == "Created user dana, member of no tenant."
    assert lines[1] == "Password (store it now; it is not shown again):"
    password = lines[2]
    assert len(password) == 24
    assert _password_is("dana", password)
    other = create_user("erin", "--generate-password").out.splitlines()[2]
    assert other != password


def test_it_adds_memberships_with_a_role(world):
    result = create_user("dana", "--generate-password", "--tenant", "acme", "--tenant", "globex", "--role", "owner")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0] == "Created user dana, owner of acme, globex."
    assert _memberships("dana") == {"acme": "owner", "globex": "owner"}


def test_staff_may_log_in_to_the_admin_with_no_permission(world):
    assert create_user("dana", "--generate-password", "--staff", "--tenant", "acme").code == 0
    user = _user("dana")
    assert user.is_staff and not user.is_superuser
    assert not user.get_all_permissions()
    assert not user.groups.exists()


def test_an_operator_is_staff_in_the_operators_group_made_when_missing(world):
    assert not Group.objects.filter(name=OPERATOR_GROUP).exists()
    result = create_user("dana", "--generate-password", "--operator", "--tenant", "acme")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0] == "Created operator dana, member of acme."
    user = _user("dana")
    assert user.is_staff and not user.is_superuser
    assert list(user.groups.values_list("name", flat=True)) == [OPERATOR_GROUP]
    assert user.get_all_permissions() == set(OPERATOR_PERMISSIONS)


def test_an_operator_joins_the_group_as_a_superuser_left_it(world):
    group = Group.objects.create(name=OPERATOR_GROUP)  # emptied by hand: left alone
    assert create_user("dana", "--generate-password", "--operator").code == 0
    assert list(group.user_set.values_list("username", flat=True)) == ["dana"]
    assert not group.permissions.exists()


def test_it_refuses_an_existing_username_and_changes_nothing(world):
    before = _user("member").password
    result = create_user("member", "--password-stdin", "--tenant", "globex", "--operator", stdin="pw-other-long\n")
    assert result.code == 1
    assert result.err == (
        "User 'member' already exists. Nothing was changed. Add them to a tenant with: manage.py add_member "
        "member <tenant>; reset their password with: manage.py changepassword member."
    )
    user = _user("member")
    assert user.password == before and not user.is_staff and not user.groups.exists()
    assert _memberships("member") == {"acme": "member"}
    assert not Group.objects.filter(name=OPERATOR_GROUP).exists()


def test_it_lists_every_invalid_input_and_stores_nothing(world):
    users = get_user_model().objects.count()
    result = create_user(
        "two words", "--password-stdin", "--email", "nope", "--tenant", "initech", "--operator", stdin="short\n"
    )
    assert result.code == 1
    assert result.err.splitlines() == [
        "Invalid input:",
        "  username: Enter a valid username. This value may contain only letters, numbers, and @/./+/-/_ characters.",
        "  --email: Enter a valid email address.",
        "  password: This password is too short. It must contain at least 8 characters.",
        "  --tenant: Tenant 'initech' does not exist.",
    ]
    assert get_user_model().objects.count() == users
    assert not Group.objects.filter(name=OPERATOR_GROUP).exists()


def test_an_unknown_tenant_after_a_known_one_stores_nothing(world):
    result = create_user("dana", "--generate-password", "--tenant", "acme", "--tenant", "initech")
    assert result.code == 1
    assert "--tenant: Tenant 'initech' does not exist." in result.err
    assert _user("dana") is None
    assert result.out == ""  # no password printed for a user that was not made


def test_it_refuses_an_empty_password_on_stdin(world):
    result = create_user("dana", "--password-stdin", stdin="\n")
    assert result.code == 1
    assert result.err == "--password-stdin: standard input gave no password (an empty first line)."
    assert _user("dana") is None


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_it_asks_twice_without_echo(world, monkeypatch):
    answers = iter(["pw-dana-long", "pw-dana-long"])
    prompts = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: prompts.append(prompt) or next(answers))
    assert create_user("dana", "--password-stdin", stdin=_Terminal()).code == 0
    assert prompts == ["Password for dana: ", "Password (again): "]
    assert _password_is("dana", "pw-dana-long")


def test_on_a_terminal_two_different_answers_store_nothing(world, monkeypatch):
    answers = iter(["pw-dana-long", "pw-dana-lung"])
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(answers))
    result = create_user("dana", "--password-stdin", stdin=_Terminal())
    assert result.code == 1
    assert result.err == "The passwords do not match; nothing was stored."
    assert _user("dana") is None


def test_a_password_option_is_required(world):
    result = call("create_user", "dana")
    assert result.code == 1  # call_command: argparse's error, as a CommandError
    assert "one of the arguments --password-stdin --generate-password is required" in result.err


@pytest.mark.django_db(transaction=True)
def test_from_the_command_line_both_password_options_are_a_usage_error():
    result = run_manage("create_user", "dana", "--password-stdin", "--generate-password")
    assert result.code == 2
    assert "not allowed with argument" in result.err
    assert _user("dana") is None


@pytest.mark.django_db(transaction=True)
def test_help_explains_the_options():
    result = run_manage("create_user", "--help")
    assert result.code == 0
    for words in ("--password-stdin", "--generate-password", "--operator", "--tenant TENANT", "changepassword"):
        assert words in result.out
