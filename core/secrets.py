"""Secret header values: sealed at rest, redacted everywhere they are shown.

A header is secret when its name is Authorization, Proxy-Authorization, Cookie or
Set-Cookie, or contains one of SECRET_HEADER_PATTERNS (token, secret, key, password, ... by
default). Its value is kept only inside the call's request spec, encrypted with Fernet
(FIELD_ENCRYPTION_KEYS: the first key encrypts, every key decrypts; without keys, one derived
from SECRET_KEY), because a scheduled call must still send it when it runs. Everything
shown or published (API, pages, admin, events, attempt log) goes through `redact_headers`.
Key rotation: docs/security.md and `manage.py rotate_secrets`.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

REDACTED = "***"
SEALED = "$sealed"

_EXACT = {"authorization", "proxy-authorization", "cookie", "set-cookie"}


class SecretUnavailable(RuntimeError):
    """A sealed value cannot be decrypted with any configured key."""


def is_secret_header(name: str) -> bool:
    return secret_header_name(name, tuple(settings.SECRET_HEADER_PATTERNS))


@lru_cache(maxsize=1024)
def secret_header_name(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether `name` is a secret header under `patterns` (SECRET_HEADER_PATTERNS, read once by
    a caller that asks for many names). Remembered per header name and pattern list (every
    attempt asks for each of its headers)."""
    lowered = name.strip().lower()
    if lowered in _EXACT:
        return True
    return any(pattern.strip().lower() in lowered for pattern in patterns if pattern.strip())


def derived_key(secret_key: str) -> bytes:
    """The Fernet key used when FIELD_ENCRYPTION_KEYS is empty."""
    return base64.urlsafe_b64encode(hashlib.sha256(b"service-agent:" + secret_key.encode()).digest())


@lru_cache(maxsize=8)
def _fernets(keys: tuple[str, ...], secret_key: str) -> tuple[MultiFernet, Fernet]:
    fernets = [Fernet(k.encode()) for k in keys] if keys else [Fernet(derived_key(secret_key))]
    return MultiFernet(fernets), fernets[0]


def _cipher() -> MultiFernet:
    return _fernets(tuple(settings.FIELD_ENCRYPTION_KEYS), settings.SECRET_KEY)[0]


def _primary() -> Fernet:
    return _fernets(tuple(settings.FIELD_ENCRYPTION_KEYS), settings.SECRET_KEY)[1]


def is_sealed(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get(SEALED), str)


def seal_headers(headers: dict[str, str]) -> dict[str, object]:
    return {
        name: {SEALED: _cipher().encrypt(value.encode()).decode()} if is_secret_header(name) else value
        for name, value in headers.items()
    }


def seal_value(value: str) -> dict[str, str]:
    """One secret (a webhook signing secret) sealed as a header value is."""
    return {SEALED: _cipher().encrypt(value.encode()).decode()}


def unseal_value(sealed: dict[str, str]) -> str:
    try:
        return _cipher().decrypt(sealed[SEALED].encode()).decode()
    except InvalidToken:
        raise SecretUnavailable("cannot decrypt a sealed value: its key is not in FIELD_ENCRYPTION_KEYS") from None


def unseal_headers(headers: dict[str, object]) -> dict[str, str]:
    plain: dict[str, str] = {}
    for name, value in headers.items():
        if is_sealed(value):
            try:
                plain[name] = _cipher().decrypt(value[SEALED].encode()).decode()  # type: ignore[index]
            except InvalidToken:
                raise SecretUnavailable(
                    f"cannot decrypt header {name!r}: its key is not in FIELD_ENCRYPTION_KEYS"
                ) from None
        else:
            plain[name] = str(value)
    return plain


def redact_headers(headers: dict[str, object] | None) -> dict[str, str]:
    return {
        name: REDACTED if (is_secret_header(name) or isinstance(value, dict)) else str(value)
        for name, value in (headers or {}).items()
    }


def rotate_sealed(headers: dict[str, object]) -> dict[str, object]:
    """Re-encrypt sealed values under the first key; values already under it are kept."""
    rotated: dict[str, object] = {}
    for name, value in headers.items():
        if is_sealed(value):
            token = value[SEALED].encode()  # type: ignore[index]
            try:
                _primary().decrypt(token)
            except InvalidToken:
                try:
                    token = _cipher().rotate(token)
                except InvalidToken:
                    raise SecretUnavailable(
                        f"cannot decrypt header {name!r}: its key is not in FIELD_ENCRYPTION_KEYS"
                    ) from None
                value = {SEALED: token.decode()}
        rotated[name] = value
    return rotated


@dataclass
class RotationResult:
    """What a re-encryption under the first key did (`manage.py rotate_secrets`): rows examined,
    rows re-encrypted, and the ids of those no configured key opens (left unchanged)."""

    examined: int = 0
    rotated: int = 0
    failed: list[str] = field(default_factory=list)


def rotate_sealed_columns(rows: QuerySet, columns: Sequence[str], *, dry_run: bool = False) -> RotationResult:
    """Re-encrypt the sealed values held in `columns` of each row of `rows` under the first key
    (a column that holds no sealed value is left alone), each row a conditional update on its old
    values; for the app that owns the table to call (webhook and call-signing secrets)."""
    result = RotationResult()
    for pk, *values in rows.order_by("pk").values_list("pk", *columns):
        result.examined += 1
        old = dict(zip(columns, values, strict=True))
        try:
            new = rotate_sealed(old)
        except SecretUnavailable:
            result.failed.append(str(pk))
            continue
        if new == old:
            continue
        result.rotated += 1
        if dry_run:
            continue
        with transaction.atomic():
            current = rows.model.objects.select_for_update().filter(pk=pk).values_list(*columns).first()
            if current is not None and dict(zip(columns, current, strict=True)) == old:
                rows.model.objects.filter(pk=pk).update(**new)
            elif current is not None:  # changed meanwhile (a rotation): not known to be re-encrypted
                result.rotated -= 1
                result.failed.append(f"{pk} (changed while it ran: run it again)")
    return result
