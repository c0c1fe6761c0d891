"""manage.py create_api_key"""

import pytest

from tenants.models import ApiKey
from tenants.selectors import api_key_lookup
from tests.commands.cli import call, run_manage
from tests.support.factories import make_tenant


@pytest.fixture
def acme(db):
    return make_tenant("acme")


def test_it_prints_a_working_key_once_and_stores_only_its_hash(acme):
    result = call("create_api_key", "acme", "--label", "billing cron")
    assert result.code == 0
    lines = result.out.strip().splitlines()
    raw = lines[-1]
    assert raw.startswith("sa_")
    assert lines[0].startswith("Created API key sa_") and "for tenant acme (billing cron)." in lines[0]
    assert "not shown again" in lines[1]
    key = ApiKey.objects.get()
    assert key.label == "billing cron"
    assert key.tenant_id == "acme"
    assert raw not in (key.key_hash, key.prefix, key.label)
    assert api_key_lookup(raw_key=raw).pk == key.pk


def test_quiet_prints_only_the_key(acme):
    result = call("create_api_key", "acme", "--quiet")
    assert result.code == 0
    raw = result.out.strip()
    assert "\n" not in raw
    assert api_key_lookup(raw_key=raw).tenant_id == "acme"


def test_each_run_makes_a_different_key(acme):
    first = call("create_api_key", "acme", "--quiet").out.strip()
    second = call("create_api_key", "acme", "--quiet").out.strip()
    assert first != second
    assert ApiKey.objects.filter(tenant_id="acme").count() == 2


@pytest.mark.django_db
def test_it_refuses_an_unknown_tenant_and_stores_nothing():
    result = call("create_api_key", "nope")
    assert result.code == 1
    assert "Tenant 'nope' does not exist." in result.err
    assert result.out == ""
    assert not ApiKey.objects.exists()


def test_it_refuses_a_label_longer_than_200_characters(acme):
    result = call("create_api_key", "acme", "--label", "l" * 201)
    assert result.code == 1
    assert "--label: A key label is at most 200 characters." in result.err
    assert not ApiKey.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_on_the_command_line_it_exits_1_with_the_error_on_stderr():
    result = run_manage("create_api_key", "nope")
    assert result.code == 1
    assert result.out == ""
    assert "CommandError: Tenant 'nope' does not exist." in result.err
    assert not ApiKey.objects.exists()


def test_its_help_says_the_key_is_shown_once():
    result = run_manage("create_api_key", "--help")
    assert result.code == 0
    assert "shown this once" in result.out
