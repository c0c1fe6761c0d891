"""Login and logout (Django auth) and the login requirement of every page."""

import pytest


def test_the_login_page_has_labelled_username_and_password_fields(client, db):
    response = client.get("/login/")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<label for="id_username">' in html
    assert '<label for="id_password">' in html


def test_a_member_logs_in_and_lands_on_the_calls_page(client, world):
    response = client.post("/login/", {"username": "owner", "password": "pw-owner-123"}, follow=True)
    assert response.redirect_chain[-1][0] == "/calls/"
    assert response.status_code == 200
    assert client.session.get("_auth_user_id") == str(world.owner.pk)


def test_it_refuses_a_wrong_password_with_a_message(client, world):
    response = client.post("/login/", {"username": "owner", "password": "wrong"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.parametrize(
    "path", ["/calls/", "/calls/new/", "/system/", "/calls/live", "/calls/01a2011b-b5e5-774f-957f-369d848f55bc/"]
)
def test_it_sends_anonymous_visitors_to_the_login_page(client, db, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_logout_ends_the_session(owner_client):
    response = owner_client.post("/logout/")
    assert response.status_code == 302
    assert owner_client.get("/calls/").status_code == 302
