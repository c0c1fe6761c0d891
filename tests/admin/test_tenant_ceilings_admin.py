"""The admin's Tenant ceilings (docs/flow-control.md, "Operator ceilings"): a superuser sets
them through tenants.services.tenant_ceilings_set, bad values are refused naming the field,
and staff who are members of a tenant never change their own."""

from __future__ import annotations

from tenants.models import TenantCeilings
from tenants.selectors import tenant_ceilings_get
from tests.support.factories import make_ceilings

URL = "/admin/tenants/tenantceilings/"
EMPTY = {
    "call_parallelism": "",
    "call_rate_per_second": "",
    "subscriptions": "",
    "test_pings_per_minute": "",
    "submissions_per_second": "",
    "max_attempts": "",
    "min_backoff_ms": "",
}


def test_a_superuser_sets_a_tenants_ceilings(admin_client, world):
    response = admin_client.post(
        URL + "add/", {**EMPTY, "tenant": "acme", "call_parallelism": "4", "submissions_per_second": "7"}
    )

    assert response.status_code == 302, response.context["adminform"].form.errors
    row = TenantCeilings.objects.get(pk="acme")
    assert (row.call_parallelism, row.submissions_per_second, row.max_attempts) == (4, 7, None)
    assert tenant_ceilings_get(tenant_id="acme").parallelism == 4


def test_a_bad_value_is_refused_naming_the_field_and_nothing_changes(admin_client, world):
    make_ceilings("acme", parallelism=4)

    refused = admin_client.post(URL + "acme/change/", {**EMPTY, "call_parallelism": "1001", "max_attempts": "30"})

    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert "call_parallelism" in errors and "max_attempts" in errors
    assert TenantCeilings.objects.get(pk="acme").call_parallelism == 4


def test_clearing_every_field_puts_the_defaults_back(admin_client, world, settings):
    make_ceilings("acme", parallelism=4)
    assert admin_client.post(URL + "acme/change/", EMPTY).status_code == 302
    assert not TenantCeilings.objects.filter(pk="acme").exists()
    assert tenant_ceilings_get(tenant_id="acme").parallelism == settings.CEILING_CALL_PARALLELISM


def test_staff_of_a_tenant_cannot_change_its_ceilings(client, world):
    from django.contrib.auth.models import Permission

    make_ceilings("globex", parallelism=2)
    world.staff_globex.user_permissions.set(
        Permission.objects.filter(codename__in=["view_tenantceilings", "change_tenantceilings", "add_tenantceilings"])
    )
    client.force_login(world.staff_globex)

    assert client.get(URL).status_code == 200
    assert client.post(URL + "globex/change/", {**EMPTY, "call_parallelism": "1000"}).status_code == 403
    assert client.post(URL + "add/", {**EMPTY, "tenant": "globex"}).status_code == 403
    assert TenantCeilings.objects.get(pk="globex").call_parallelism == 2
    # Another tenant's row is out of sight.
    make_ceilings("acme", parallelism=9)
    assert "acme" not in client.get(URL).content.decode()
