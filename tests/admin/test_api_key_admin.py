"""Admin of API keys: created through api_key_create, the key shown once, scoped to own tenants."""

from tenants.models import ApiKey
from tenants.selectors import api_key_lookup
from tenants.services import hash_api_key

CHANGELIST = "/admin/tenants/apikey/"


def _raw_key_from(response) -> str:
    from tests.admin.test_admin_secrets_and_staff_subscriptions import shown_secret

    return shown_secret(response, "sa_")


def test_a_created_key_is_shown_once_and_only_its_hash_is_stored(admin_client, world):
    response = admin_client.post(CHANGELIST + "add/", {"tenant": "acme", "label": "from admin"})
    raw = _raw_key_from(response)
    key = ApiKey.objects.get(label="from admin")
    assert key.key_hash == hash_api_key(raw) and raw not in (key.prefix + key.key_hash)
    assert api_key_lookup(raw_key=raw).tenant_id == "acme"
    # The page that answers the creation shows it once; then never again.
    assert raw not in admin_client.get(CHANGELIST).content.decode()
    assert raw not in admin_client.get(f"{CHANGELIST}{key.pk}/change/").content.decode()


def test_revoke_makes_a_key_stop_working(admin_client, world):
    key = api_key_lookup(raw_key=world.acme_key)
    admin_client.post(CHANGELIST, {"action": "revoke", "_selected_action": [str(key.pk)]})
    assert api_key_lookup(raw_key=world.acme_key) is None


def test_non_superuser_staff_cannot_create_a_key_for_another_tenant(staff_client, world):
    before = ApiKey.objects.count()
    response = staff_client.post(CHANGELIST + "add/", {"tenant": "acme", "label": "sneaky"})
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert ApiKey.objects.count() == before
    response = staff_client.post(CHANGELIST + "add/", {"tenant": "globex", "label": "fine"})
    _raw_key_from(response)  # made: the page that shows the key
    assert ApiKey.objects.get(label="fine").tenant_id == "globex"


def test_non_superuser_staff_see_only_their_tenants_keys(staff_client, world):
    response = staff_client.get(CHANGELIST)
    assert {key.tenant_id for key in response.context["cl"].result_list} == {"globex"}


def test_non_superuser_staff_cannot_revoke_another_tenants_key(staff_client, world):
    key = api_key_lookup(raw_key=world.acme_key)
    staff_client.post(CHANGELIST, {"action": "revoke", "_selected_action": [str(key.pk)]})
    assert api_key_lookup(raw_key=world.acme_key) is not None


def test_a_remembered_key_is_refused_at_once_after_revocation_in_this_process(world, settings):
    from tenants.models import ApiKey
    from tenants.services import api_key_revoke

    settings.API_KEY_CACHE_SECONDS = 60
    key = api_key_lookup(raw_key=world.acme_key)
    assert api_key_lookup(raw_key=world.acme_key) is not None  # now remembered
    api_key_revoke(key_ids=[key.pk])
    assert api_key_lookup(raw_key=world.acme_key) is None
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
