"""Admin of memberships: added through membership_add, limited to the staff member's tenants."""

from tenants.models import Membership

CHANGELIST = "/admin/tenants/membership/"


def test_a_superuser_adds_a_member(admin_client, world):
    response = admin_client.post(CHANGELIST + "add/", {"user": world.outsider.pk, "tenant": "acme", "role": "owner"})
    assert response.status_code == 302
    assert Membership.objects.get(user=world.outsider, tenant_id="acme").role == "owner"


def test_it_refuses_a_duplicate_membership(admin_client, world):
    response = admin_client.post(CHANGELIST + "add/", {"user": world.owner.pk, "tenant": "acme", "role": "member"})
    assert response.status_code == 200
    assert Membership.objects.get(user=world.owner, tenant_id="acme").role == "owner"


def test_non_superuser_staff_manage_only_their_tenants_members(staff_client, world):
    response = staff_client.get(CHANGELIST)
    assert {m.tenant_id for m in response.context["cl"].result_list} == {"globex"}
    response = staff_client.post(
        CHANGELIST + "add/", {"user": world.staff_globex.pk, "tenant": "acme", "role": "owner"}
    )
    assert response.status_code == 200
    assert not Membership.objects.filter(user=world.staff_globex, tenant_id="acme").exists()
