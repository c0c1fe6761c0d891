"""The header's tenant switcher: the current tenant lives in the session, only own tenants, only by POST."""

from eventservice.dashboard.tenancy import SESSION_KEY
from tests.support.factories import HOUR, make_call, make_member, make_user


def test_a_member_of_one_tenant_sees_its_name_and_no_switcher(owner_client):
    html = owner_client.get("/calls/").content.decode()
    assert 'name="tenant"' not in html
    assert "Acme" in html


def test_a_member_of_two_tenants_switches_and_sees_the_other_tenants_calls(owner_client, world):
    make_member("owner", "globex")
    make_call("acme", name="acme-only call", due_in=HOUR)
    make_call("globex", name="globex-only call", due_in=HOUR)

    html = owner_client.get("/calls/").content.decode()
    assert 'name="tenant"' in html and '<option value="globex"' in html
    assert "acme-only call" in html and "globex-only call" not in html

    response = owner_client.post("/tenant/", {"tenant": "globex"})
    assert response.status_code == 302 and response["Location"] == "/calls/"
    assert owner_client.session[SESSION_KEY] == "globex"
    html = owner_client.get("/calls/").content.decode()
    assert "globex-only call" in html and "acme-only call" not in html


def test_it_refuses_to_switch_to_a_tenant_the_user_is_not_a_member_of(outsider_client):
    outsider_client.get("/calls/")
    assert outsider_client.session[SESSION_KEY] == "globex"
    response = outsider_client.post("/tenant/", {"tenant": "acme"}, follow=True)
    assert "You are not a member of that tenant." in response.content.decode()
    assert outsider_client.session[SESSION_KEY] == "globex"


def test_a_foreign_tenant_left_in_the_session_falls_back_to_the_users_own(outsider_client):
    session = outsider_client.session
    session[SESSION_KEY] = "acme"
    session.save()
    make_call("acme", name="secret acme plan", due_in=HOUR)
    html = outsider_client.get("/calls/").content.decode()
    assert "secret acme plan" not in html
    assert outsider_client.session[SESSION_KEY] == "globex"


def test_a_user_without_any_tenant_is_told_how_to_get_one(client, db):
    loner = make_user("loner")
    client.force_login(loner)
    response = client.get("/calls/")
    assert response.status_code == 403
    assert "manage.py add_member loner" in response.content.decode()


def test_switching_needs_a_post(owner_client):
    assert owner_client.get("/tenant/").status_code == 405


def test_a_shared_list_link_of_another_own_tenant_offers_the_switch_and_changes_nothing(owner_client, world):
    make_member("owner", "globex")
    make_call("acme", name="acme call", due_in=HOUR)
    make_call("globex", name="globex call", due_in=HOUR)
    owner_client.get("/calls/")
    response = owner_client.get("/calls/?tenant=globex&q=globex")
    html = response.content.decode()
    assert response.status_code == 200
    assert owner_client.session[SESSION_KEY] == "acme"
    assert "This link is for Globex" in html
    assert "globex call" not in html and "acme call" not in html
    # The offer is a CSRF-protected POST that comes back to the link.
    assert 'action="/tenant/"' in html and 'name="csrfmiddlewaretoken"' in html
    assert '<input type="hidden" name="tenant" value="globex">' in html
    assert '<input type="hidden" name="next" value="/calls/?tenant=globex&amp;q=globex">' in html


def test_accepting_the_offer_switches_and_opens_the_link(owner_client, world):
    make_member("owner", "globex")
    make_call("globex", name="globex call", due_in=HOUR)
    response = owner_client.post("/tenant/", {"tenant": "globex", "next": "/calls/?tenant=globex&q=globex"})
    assert response.status_code == 302 and response["Location"] == "/calls/?tenant=globex&q=globex"
    assert owner_client.session[SESSION_KEY] == "globex"
    html = owner_client.get(response["Location"]).content.decode()
    assert "globex call" in html
    assert '<input type="hidden" name="tenant" value="globex">' in html


def test_the_switch_never_redirects_off_site(owner_client, world):
    make_member("owner", "globex")
    response = owner_client.post("/tenant/", {"tenant": "globex", "next": "https://evil.example/calls/"})
    assert response["Location"] == "/calls/"


def test_a_link_to_the_current_tenant_just_opens(owner_client, world):
    make_member("owner", "globex")
    make_call("acme", name="acme call", due_in=HOUR)
    html = owner_client.get("/calls/?tenant=acme").content.decode()
    assert "acme call" in html and "This link is for" not in html


def test_a_switch_with_a_csrf_token_missing_is_refused(client, world):
    from django.test import Client

    make_member("owner", "globex")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.owner)
    strict.get("/calls/")
    assert strict.post("/tenant/", {"tenant": "globex"}).status_code == 403
    assert strict.session[SESSION_KEY] == "acme"


def test_a_list_link_of_a_foreign_tenant_shows_the_users_own_calls(outsider_client, world):
    make_call("acme", name="acme call", due_in=HOUR)
    html = outsider_client.get("/calls/?tenant=acme").content.decode()
    assert "acme call" not in html and "This link is for" not in html
    assert outsider_client.session[SESSION_KEY] == "globex"
