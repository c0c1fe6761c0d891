"""Admin of tenants: superusers create them (tenant_create); other staff see only theirs."""

from tenants.models import Tenant

CHANGELIST = "/admin/tenants/tenant/"


def test_a_superuser_creates_a_tenant(admin_client, db):
    response = admin_client.post(
        CHANGELIST + "add/",
        {
            "id": "initech",
            "name": "Initech",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
            "memberships-MIN_NUM_FORMS": "0",
            "memberships-MAX_NUM_FORMS": "1000",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Tenant.objects.get(id="initech").name == "Initech"


def test_it_refuses_an_invalid_tenant_id(admin_client, db):
    response = admin_client.post(
        CHANGELIST + "add/",
        {
            "id": "Not A Slug",
            "name": "x",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 200
    assert not Tenant.objects.filter(name="x").exists()


def test_non_superuser_staff_see_only_their_tenant_and_cannot_add_or_change_others(staff_client, world):
    response = staff_client.get(CHANGELIST)
    assert [tenant.id for tenant in response.context["cl"].result_list] == ["globex"]
    assert staff_client.get(CHANGELIST + "add/").status_code == 403
    assert staff_client.get(CHANGELIST + "acme/change/").status_code == 302
    staff_client.post(CHANGELIST + "acme/change/", {"name": "Hijacked"})
    assert Tenant.objects.get(id="acme").name == "Acme"
