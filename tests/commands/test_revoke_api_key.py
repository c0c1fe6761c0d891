"""manage.py revoke_api_key <tenant> <key | prefix | id>"""

from __future__ import annotations

import pytest
from django.test import override_settings

from tenants.models import ApiKey
from tenants.selectors import api_key_lookup
from tests.commands.cli import call, run_manage
from tests.support.factories import make_api_key


@pytest.fixture
def cron(world):
    key, raw = make_api_key("acme", label="billing cron")
    return key, raw


def _revoked_at(key: ApiKey):
    return ApiKey.objects.get(pk=key.pk).revoked_at


@pytest.mark.parametrize("named_by", ["id", "prefix", "prefix…", "whole key"])
def test_it_revokes_a_key_named_any_way_the_list_shows_it(cron, named_by):
    key, raw = cron
    given = {"id": str(key.pk), "prefix": key.prefix, "prefix…": f"{key.prefix}…", "whole key": raw}[named_by]
    result = call("revoke_api_key", "acme", given)
    assert result.code == 0, result.err
    assert result.out.startswith(f"Revoked API key {key.prefix}… (billing cron) of tenant acme.")
    assert _revoked_at(key) is not None
    assert api_key_lookup(raw_key=raw) is None
    # Only that key.
    assert ApiKey.objects.filter(revoked_at__isnull=False).count() == 1


@override_settings(API_KEY_CACHE_SECONDS=5)
def test_it_says_when_other_processes_refuse_the_key(cron):
    key, _ = cron
    result = call("revoke_api_key", "acme", str(key.pk))
    assert result.out == (
        f"Revoked API key {key.prefix}… (billing cron) of tenant acme. Running web processes refuse it "
        "within 5 s (API_KEY_CACHE_SECONDS: how long each remembers a live key).\n"
    )


@override_settings(API_KEY_CACHE_SECONDS=0)
def test_without_a_key_cache_the_next_request_is_refused(cron):
    key, _ = cron
    result = call("revoke_api_key", "acme", str(key.pk))
    assert result.out.endswith("Web processes refuse it from their next request (API_KEY_CACHE_SECONDS=0).\n")


def test_revoking_again_changes_nothing(cron):
    key, _ = cron
    assert call("revoke_api_key", "acme", key.prefix).code == 0
    first = _revoked_at(key)
    result = call("revoke_api_key", "acme", key.prefix)
    assert result.code == 0
    assert result.out == (
        f"API key {key.prefix}… (billing cron) of tenant acme was already revoked at "
        f"{first:%Y-%m-%d %H:%M:%S}Z; nothing changed.\n"
    )
    assert _revoked_at(key) == first


def test_it_refuses_a_key_of_another_tenant_and_revokes_nothing(world, cron):
    globex_key = ApiKey.objects.get(tenant_id="globex")
    for given in (str(globex_key.pk), globex_key.prefix, world.globex_key):
        result = call("revoke_api_key", "acme", given)
        assert result.code == 1
        assert result.err == f"API key {given!r} belongs to another tenant, not acme; nothing was revoked."
    assert not ApiKey.objects.filter(revoked_at__isnull=False).exists()
    assert api_key_lookup(raw_key=world.globex_key) is not None


def test_it_refuses_an_unknown_key(cron):
    for given in ("999999", "sa_unknown", "sa_" + "x" * 43, "nonsense"):
        result = call("revoke_api_key", "acme", given)
        assert result.code == 1
        assert result.err == f"Tenant acme has no API key {given!r} (list them with: manage.py list_api_keys acme)."
    assert not ApiKey.objects.filter(revoked_at__isnull=False).exists()


def test_a_prefix_shared_by_two_keys_asks_for_the_id(cron):
    key, _ = cron
    twin, _ = make_api_key("acme", label="twin")
    ApiKey.objects.filter(pk=twin.pk).update(prefix=key.prefix)
    result = call("revoke_api_key", "acme", key.prefix)
    assert result.code == 1
    assert result.err == (
        f"Several API keys of tenant acme start with {key.prefix!r} (ids {key.pk}, {twin.pk}): give the id."
    )
    assert not ApiKey.objects.filter(revoked_at__isnull=False).exists()


@pytest.mark.django_db
def test_it_refuses_an_unknown_tenant():
    result = call("revoke_api_key", "nope", "1")
    assert result.code == 1
    assert result.err == "Tenant 'nope' does not exist (create it with: manage.py create_tenant nope)."


@pytest.mark.django_db(transaction=True)
def test_help_names_the_cache_window():
    result = run_manage("revoke_api_key", "--help")
    assert result.code == 0
    assert "API_KEY_CACHE_SECONDS" in result.out and "within that many seconds" in result.out


def test_the_api_refuses_the_key_once_revoked(cron, client):
    key, raw = cron
    path = "/api/tenants/acme/service-calls"
    assert client.get(path, HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    assert call("revoke_api_key", "acme", key.prefix).code == 0
    assert client.get(path, HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401
