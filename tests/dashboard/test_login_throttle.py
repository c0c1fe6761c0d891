"""Failed logins: after LOGIN_FAILURE_LIMIT for one username from one address, that pair is
refused for LOGIN_COOLOFF_MINUTES (django-axes). docs/security.md#6-deployment-hardening"""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings

LIMIT = settings.AXES_FAILURE_LIMIT


def _login(client, password: str, *, username: str = "owner", address: str = "127.0.0.1", path: str = "/login/"):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_the_limit_is_five_failures_for_fifteen_minutes():
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 15 * 60


def test_failures_below_the_limit_still_let_the_right_password_in(client, world):
    for _ in range(LIMIT - 1):
        assert _login(client, "wrong").status_code == 200
    response = _login(client, "pw-owner-123")
    assert response.status_code == 302
    assert client.session.get("_auth_user_id") == str(world.owner.pk)
    # A success clears the count.
    assert not AccessAttempt.objects.filter(username="owner").exists()


def test_after_the_limit_even_the_right_password_is_refused_with_a_clear_message(client, world):
    for _ in range(LIMIT - 1):
        _login(client, "wrong")
    locked = _login(client, "wrong")
    assert locked.status_code == 429
    response = _login(client, "pw-owner-123")
    html = response.content.decode()
    assert response.status_code == 429
    assert response["Retry-After"] == "900"
    assert "Too many failed logins for this username from your address" in html
    assert "blocked for 15 minutes" in html
    assert 'name="username"' in html and 'value="owner"' in html  # the form is still there
    assert "_auth_user_id" not in client.session


def test_the_lockout_holds_for_that_username_from_that_address_only(client, world):
    for _ in range(LIMIT):
        _login(client, "wrong")
    assert _login(client, "pw-owner-123").status_code == 429
    assert _login(client, "pw-member-123", username="member").status_code == 302
    client.logout()
    assert _login(client, "pw-owner-123", address="10.0.0.2").status_code == 302


def test_the_admin_login_counts_and_refuses_the_same_way(client, world):
    for _ in range(LIMIT):
        _login(client, "wrong", path="/admin/login/")
    response = _login(client, "pw-owner-123")
    assert response.status_code == 429


def test_after_the_cool_off_the_right_password_works_again(client, world):
    for _ in range(LIMIT):
        _login(client, "wrong")
    assert _login(client, "pw-owner-123").status_code == 429
    AccessAttempt.objects.update(attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=16))
    assert _login(client, "pw-owner-123").status_code == 302


@pytest.mark.parametrize("hops,forwarded,expected", [(0, "6.6.6.6", "127.0.0.1"), (1, "6.6.6.6, 10.9.8.7", "10.9.8.7")])
def test_the_address_is_the_peer_unless_proxies_are_trusted(client, world, settings, hops, forwarded, expected):
    settings.TRUSTED_PROXY_COUNT = hops
    client.post("/login/", {"username": "owner", "password": "wrong"}, HTTP_X_FORWARDED_FOR=forwarded)
    assert AccessAttempt.objects.get().ip_address == expected
