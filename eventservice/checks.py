"""System checks for configuration mistakes (run by `manage.py check` and at start-up)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register


@register()
def encryption_keys_check(app_configs, **kwargs):
    from cryptography.fernet import Fernet

    errors = []
    for index, key in enumerate(settings.FIELD_ENCRYPTION_KEYS):
        try:
            Fernet(key.encode())
        except ValueError:
            errors.append(Error(f"FIELD_ENCRYPTION_KEYS entry {index} is not a Fernet key", id="serviceagent.E002"))
    return errors


@register(deploy=True)
def secret_key_check(app_configs, **kwargs):
    if settings.SECRET_KEY.startswith("dev-insecure"):
        return [
            Warning(
                "SECRET_KEY is the public development key (DEBUG=true and no key given); set SECRET_KEY.",
                id="serviceagent.W001",
            )
        ]
    return []
