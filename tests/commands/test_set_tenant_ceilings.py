"""manage.py set_tenant_ceilings (docs/commands.md): sets some of a tenant's ceilings, puts one
back to its default, shows them; a bad value names its option and changes nothing."""

from __future__ import annotations

from tenants.models import TenantCeilings
from tenants.selectors import tenant_ceilings_get
from tests.commands.cli import call


def test_it_sets_the_ceilings_given_and_shows_them_all(world):
    result = call(
        "set_tenant_ceilings", "acme", "--parallelism", "5", "--rate-per-second", "2.5", "--test-pings-per-minute", "3"
    )

    assert result.code == 0, result.err
    row = TenantCeilings.objects.get(pk="acme")
    assert (row.call_parallelism, row.call_rate_per_second, row.test_pings_per_minute) == (5, 2.5, 3)
    assert row.subscriptions is None
    assert "parallelism" in result.out and "(set for this tenant)" in result.out
    assert "(default, MAX_SUBSCRIPTIONS_PER_TENANT)" in result.out
    ceilings = tenant_ceilings_get(tenant_id="acme")
    assert (ceilings.parallelism, ceilings.rate_per_second, ceilings.test_pings_per_minute) == (5, 2.5, 3)


def test_default_puts_a_ceiling_back_and_the_last_one_removes_the_row(world):
    call("set_tenant_ceilings", "acme", "--max-attempts", "4")
    assert call("set_tenant_ceilings", "acme", "--max-attempts", "default").code == 0
    assert not TenantCeilings.objects.filter(pk="acme").exists()


def test_without_options_it_only_shows(world):
    result = call("set_tenant_ceilings", "globex")
    assert result.code == 0
    assert "submissions-per-second" in result.out
    assert not TenantCeilings.objects.exists()


def test_a_bad_value_names_its_option_and_changes_nothing(world):
    call("set_tenant_ceilings", "acme", "--parallelism", "5")
    for option, value in (
        ("--parallelism", "0"),
        ("--rate-per-second", "lots"),
        ("--max-attempts", "21"),
        ("--min-backoff-ms", "50"),
        ("--subscriptions", "2.5"),
    ):
        result = call("set_tenant_ceilings", "acme", "--parallelism", "7", option, value)
        assert result.code == 1, (option, value)
        assert option in result.err, result.err
        assert TenantCeilings.objects.get(pk="acme").call_parallelism == 5


def test_an_unknown_tenant_is_refused(world):
    result = call("set_tenant_ceilings", "nosuch", "--parallelism", "5")
    assert result.code == 1
    assert "does not exist" in result.err
