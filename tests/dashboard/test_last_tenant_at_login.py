"""At login the current tenant is the one the user last switched to, while they are still a member."""

from eventservice.dashboard.tenancy import LAST_TENANT_COOKIE, SESSION_KEY
from tenants.models import Membership
from tests.support.factories import make_member


def login(client, username: str):
    response = client.post("/login/", {"username": username, "password": f"pw-{username}-123"})
    assert response.status_code == 302
    client.get("/calls/")


def test_a_member_of_two_tenants_logs_back_in_on_the_tenant_last_switched_to(client, world):
    make_member("owner", "globex")
    login(client, "owner")
    assert client.session[SESSION_KEY] == "acme"
    client.post("/tenant/", {"tenant": "globex"})
    client.post("/logout/")

    login(client, "owner")
    assert client.session[SESSION_KEY] == "globex"
    assert "globex" in client.get("/calls/").content.decode()


def test_a_tenant_the_user_left_is_not_restored(client, world):
    make_member("owner", "globex")
    login(client, "owner")
    client.post("/tenant/", {"tenant": "globex"})
    client.post("/logout/")
    Membership.objects.filter(user=world.owner, tenant_id="globex").delete()

    login(client, "owner")
    assert client.session[SESSION_KEY] == "acme"


def test_another_users_last_tenant_is_not_restored(client, world):
    make_member("owner", "globex")
    make_member("other", "acme")
    make_member("other", "globex")
    login(client, "owner")
    client.post("/tenant/", {"tenant": "globex"})
    client.post("/logout/")

    login(client, "other")
    assert client.session[SESSION_KEY] == "acme"


def test_a_forged_cookie_is_ignored(client, world):
    make_member("owner", "globex")
    client.cookies[LAST_TENANT_COOKIE] = f"{world.owner.pk}:globex"
    login(client, "owner")
    assert client.session[SESSION_KEY] == "acme"
