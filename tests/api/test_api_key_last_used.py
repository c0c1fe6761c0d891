"""An API key's last use is recorded by tenants.services.api_key_touch, at most once a minute;
looking a key up writes nothing."""

from datetime import timedelta

from django.utils import timezone

from tenants.models import ApiKey
from tenants.selectors import api_key_lookup
from tests.support.api import ApiClient, calls_url


def _last_used(raw_key):
    return ApiKey.objects.get(key_hash=api_key_lookup(raw_key=raw_key).key_hash).last_used_at


def test_a_lookup_alone_records_nothing(world):
    assert api_key_lookup(raw_key=world.acme_key) is not None
    assert _last_used(world.acme_key) is None


def test_an_api_request_records_the_keys_use_once_a_minute(world):
    api = ApiClient(world.acme_key)
    assert api.get(calls_url()).status_code == 200
    first = _last_used(world.acme_key)
    assert first is not None

    assert api.get(calls_url()).status_code == 200
    assert _last_used(world.acme_key) == first  # within the minute: no write

    an_hour_ago = timezone.now() - timedelta(hours=1)
    ApiKey.objects.filter(last_used_at=first).update(last_used_at=an_hour_ago)
    assert api.get(calls_url()).status_code == 200
    assert _last_used(world.acme_key) > an_hour_ago
    # The other tenant's key was not touched.
    assert _last_used(world.globex_key) is None
