"""manage.py list_api_keys <tenant> [--json]"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tenants.models import ApiKey
from tenants.services import api_key_revoke
from tests.commands.cli import call, run_manage
from tests.support.factories import make_api_key, make_tenant

CREATED = datetime(2026, 11, 22, 2, 36, 25, 461000, tzinfo=UTC)
USED = datetime(2026, 11, 22, 3, 0, 1, tzinfo=UTC)


@pytest.fixture
def keys(world):
    """acme: its world key (live), a used key and a revoked one; globex: its own key."""
    used, used_raw = make_api_key("acme", label="billing cron")
    revoked, revoked_raw = make_api_key("acme", label="")
    api_key_revoke(key_ids=[revoked.pk])
    ApiKey.objects.filter(tenant_id="acme").update(created_at=CREATED)
    ApiKey.objects.filter(pk=used.pk).update(last_used_at=USED)
    return {"used": ApiKey.objects.get(pk=used.pk), "revoked": ApiKey.objects.get(pk=revoked.pk)}, [
        world.acme_key,
        used_raw,
        revoked_raw,
    ]


def test_it_lists_the_tenants_keys_newest_first_without_secrets(keys):
    (rows, raws) = keys
    result = call("list_api_keys", "acme")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split() == ["ID", "KEY", "LABEL", "CREATED", "LAST", "USED", "REVOKED"]
    revoked, used = rows["revoked"], rows["used"]
    # Same creation time: the later id first.
    assert lines[1].split()[:3] == [str(revoked.pk), f"{revoked.prefix}…", "-"]
    assert lines[1].endswith(f"{revoked.revoked_at:%Y-%m-%d %H:%M:%S}Z")
    assert lines[2].split() == [
        str(used.pk),
        f"{used.prefix}…",
        "billing",
        "cron",
        "2026-11-22",
        "02:36:25Z",
        "2026-11-22",
        "03:00:01Z",
        "-",
    ]
    assert lines[-1] == "3 keys (2 live, 1 revoked)"
    for raw in raws:
        assert raw not in result.out
    for key in ApiKey.objects.all():
        assert key.key_hash not in result.out
    assert "globex" not in result.out


def test_json_has_the_same_fields_and_never_the_key_or_its_hash(keys):
    (rows, raws) = keys
    result = call("list_api_keys", "acme", "--json")
    assert result.code == 0, result.err
    body = json.loads(result.out)
    assert [item["id"] for item in body] == sorted(
        (key.pk for key in ApiKey.objects.filter(tenant_id="acme")), reverse=True
    )
    used = next(item for item in body if item["id"] == rows["used"].pk)
    assert used == {
        "id": rows["used"].pk,
        "prefix": rows["used"].prefix,
        "label": "billing cron",
        "createdAt": "2026-11-22T02:36:25.461Z",
        "lastUsedAt": "2026-11-22T03:00:01.000Z",
        "revokedAt": None,
    }
    assert next(item for item in body if item["id"] == rows["revoked"].pk)["revokedAt"] is not None
    for secret in [*raws, *ApiKey.objects.values_list("key_hash", flat=True)]:
        assert secret not in result.out


@pytest.mark.django_db
def test_a_tenant_without_keys_says_how_to_make_one():
    make_tenant("acme")
    result = call("list_api_keys", "acme")
    assert result.code == 0
    assert result.out == "Tenant acme has no API keys (make one with: manage.py create_api_key acme).\n"
    assert json.loads(call("list_api_keys", "acme", "--json").out) == []


@pytest.mark.django_db
def test_it_refuses_an_unknown_tenant():
    result = call("list_api_keys", "nope")
    assert result.code == 1
    assert result.err == "Tenant 'nope' does not exist (create it with: manage.py create_tenant nope)."


@pytest.mark.django_db(transaction=True)
def test_help_says_the_keys_are_not_stored():
    result = run_manage("list_api_keys", "--help")
    assert result.code == 0
    assert "are not stored" in result.out and "revoke_api_key" in result.out
