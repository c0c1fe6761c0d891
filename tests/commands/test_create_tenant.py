"""manage.py create_tenant"""

import pytest

from tenants.models import Tenant
from tests.commands.cli import call, run_manage


@pytest.mark.django_db
def test_it_creates_a_tenant_with_its_name():
    result = call("create_tenant", "team-7", "--name", "Team Seven")
    assert result.code == 0
    assert result.out.strip() == "Created tenant team-7 (Team Seven)."
    tenant = Tenant.objects.get(id="team-7")
    assert tenant.name == "Team Seven"


@pytest.mark.django_db
def test_the_name_defaults_to_the_slug():
    assert call("create_tenant", "solo").code == 0
    assert Tenant.objects.get(id="solo").name == "solo"


@pytest.mark.django_db
@pytest.mark.parametrize("slug", ["Acme", "a", "-acme", "acme_corp", "acme corp", "x" * 64])
def test_it_refuses_an_invalid_slug_and_stores_nothing(slug):
    result = call("create_tenant", "--", slug)
    assert result.code == 1
    assert "Invalid input:" in result.err
    assert "slug: A tenant id is 2-63 characters" in result.err
    assert not Tenant.objects.exists()


@pytest.mark.django_db
def test_it_refuses_an_existing_tenant_and_leaves_it_unchanged():
    call("create_tenant", "acme", "--name", "Acme")
    result = call("create_tenant", "acme", "--name", "Other")
    assert result.code == 1
    assert "Tenant 'acme' already exists." in result.err
    assert list(Tenant.objects.values_list("id", "name")) == [("acme", "Acme")]


@pytest.mark.django_db
def test_it_refuses_a_name_longer_than_200_characters():
    result = call("create_tenant", "acme", "--name", "n" * 201)
    assert result.code == 1
    assert "--name: A tenant name is at most 200 characters." in result.err
    assert not Tenant.objects.exists()


@pytest.mark.django_db
def test_it_refuses_a_missing_slug():
    result = call("create_tenant")
    assert result.code == 1
    assert "the following arguments are required: slug" in result.err


@pytest.mark.django_db(transaction=True)
def test_on_the_command_line_it_exits_1_with_the_error_on_stderr():
    result = run_manage("create_tenant", "Not_A_Slug")
    assert result.code == 1
    assert result.out == ""
    assert "CommandError: Invalid input:" in result.err
    assert not Tenant.objects.exists()


def test_its_help_explains_the_slug():
    result = run_manage("create_tenant", "--help")
    assert result.code == 0
    assert "lowercase letters, digits and '-'" in result.out
    assert "--name NAME" in result.out
