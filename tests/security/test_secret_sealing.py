"""core.secrets: which headers are secret, sealing at rest, redaction for display."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from core.secrets import (
    REDACTED,
    SEALED,
    SecretUnavailable,
    derived_key,
    is_secret_header,
    redact_headers,
    seal_headers,
    unseal_headers,
)
from orchestration.models import ServiceCall
from tests.support.factories import make_call

KEY_A = Fernet.generate_key().decode()
KEY_B = Fernet.generate_key().decode()


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "authorization",
        "Proxy-Authorization",
        "Cookie",
        "Set-Cookie",
        "X-Api-Key",
        "Api-Key",
        "X-Auth-Token",
        "X-CSRF-Token",
        "Client-Secret",
        "X-Db-Password",
        "PASSWORD",
    ],
)
def test_authorization_cookies_and_key_like_names_are_secret(name):
    assert is_secret_header(name)


@pytest.mark.parametrize("name", ["Accept", "Content-Type", "X-Trace", "User-Agent", "If-None-Match", "Keep-Alive"])
def test_other_headers_are_not(name):
    assert not is_secret_header(name)


def test_the_patterns_are_configurable(settings):
    settings.SECRET_HEADER_PATTERNS = ["Signature", " "]
    assert is_secret_header("X-Hub-Signature")
    assert is_secret_header("Authorization")  # always, whatever the patterns
    assert not is_secret_header("X-Api-Key")


def test_sealed_values_are_not_the_plaintext_and_unseal_back(settings):
    settings.FIELD_ENCRYPTION_KEYS = [KEY_A]
    sealed = seal_headers({"Authorization": "Bearer abc123", "Accept": "text/plain"})
    assert sealed["Accept"] == "text/plain"
    assert set(sealed["Authorization"]) == {SEALED}
    assert "abc123" not in str(sealed)
    assert Fernet(KEY_A.encode()).decrypt(sealed["Authorization"][SEALED].encode()) == b"Bearer abc123"
    assert unseal_headers(sealed) == {"Authorization": "Bearer abc123", "Accept": "text/plain"}


def test_the_first_key_encrypts_and_every_key_decrypts(settings):
    settings.FIELD_ENCRYPTION_KEYS = [KEY_A]
    old = seal_headers({"X-Api-Key": "k-old"})
    settings.FIELD_ENCRYPTION_KEYS = [KEY_B, KEY_A]
    new = seal_headers({"X-Api-Key": "k-new"})
    assert unseal_headers(old) == {"X-Api-Key": "k-old"}
    assert Fernet(KEY_B.encode()).decrypt(new["X-Api-Key"][SEALED].encode()) == b"k-new"
    settings.FIELD_ENCRYPTION_KEYS = [KEY_B]
    with pytest.raises(SecretUnavailable, match="X-Api-Key"):
        unseal_headers(old)


def test_without_keys_the_key_is_derived_from_secret_key(settings):
    settings.FIELD_ENCRYPTION_KEYS = []
    settings.SECRET_KEY = "a-secret-key-for-this-test-only-0123456789"
    sealed = seal_headers({"Cookie": "sid=1"})
    assert Fernet(derived_key(settings.SECRET_KEY)).decrypt(sealed["Cookie"][SEALED].encode()) == b"sid=1"
    settings.SECRET_KEY = "another-secret-key-for-this-test-0123456789"
    with pytest.raises(SecretUnavailable):
        unseal_headers(sealed)


def test_redaction_hides_secret_names_and_sealed_values():
    shown = redact_headers({"Authorization": "Bearer x", "X-Token": {SEALED: "gAAAA"}, "Accept": "a"})
    assert shown == {"Authorization": REDACTED, "X-Token": REDACTED, "Accept": "a"}
    assert redact_headers(None) == {}


def test_a_submitted_call_stores_only_sealed_values(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = [KEY_A]
    call = make_call(name="n", headers={"Authorization": "Bearer tok-777", "X-A": "1"})
    stored = ServiceCall.objects.get(pk=call.pk).request_spec["headers"]
    assert stored["X-A"] == "1"
    assert "tok-777" not in str(stored)
    assert unseal_headers(stored)["Authorization"] == "Bearer tok-777"
