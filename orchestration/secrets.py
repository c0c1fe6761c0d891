"""Secret header values: sealed at rest, redacted everywhere they are shown."""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

REDACTED = "***"
SEALED = "$sealed"

_EXACT = {"authorization", "proxy-authorization", "cookie", "set-cookie"}


def is_secret_header(name: str) -> bool:
    lowered = name.lower()
    if lowered in _EXACT:
        return True
    return any(pattern in lowered for pattern in settings.SECRET_HEADER_PATTERNS)


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    if keys:
        return MultiFernet([Fernet(k.encode()) for k in keys])
    # Without configured keys, derive one from SECRET_KEY (documented in the README).
    derived = base64.urlsafe_b64encode(hashlib.sha256(b"service-agent:" + secret_key.encode()).digest())
    return MultiFernet([Fernet(derived)])


def _cipher() -> MultiFernet:
    return _fernet(tuple(settings.FIELD_ENCRYPTION_KEYS), settings.SECRET_KEY)


def seal_headers(headers: dict[str, str]) -> dict[str, object]:
    return {
        name: {SEALED: _cipher().encrypt(value.encode()).decode()} if is_secret_header(name) else value
        for name, value in headers.items()
    }


def unseal_headers(headers: dict[str, object]) -> dict[str, str]:
    plain: dict[str, str] = {}
    for name, value in headers.items():
        if isinstance(value, dict) and SEALED in value:
            try:
                plain[name] = _cipher().decrypt(value[SEALED].encode()).decode()
            except InvalidToken:
                raise RuntimeError(f"cannot decrypt header {name!r}: encryption key missing") from None
        else:
            plain[name] = str(value)
    return plain


def redact_headers(headers: dict[str, object] | None) -> dict[str, str]:
    return {
        name: REDACTED if (is_secret_header(name) or isinstance(value, dict)) else str(value)
        for name, value in (headers or {}).items()
    }


def rotate_sealed(headers: dict[str, object]) -> dict[str, object]:
    """Re-encrypt sealed values under the first key (used by `rotate_secrets`)."""
    return {
        name: {SEALED: _cipher().rotate(value[SEALED].encode()).decode()}
        if isinstance(value, dict) and SEALED in value else value
        for name, value in headers.items()
    }
