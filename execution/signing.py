"""Signed calls (docs/api.md, "Signed calls"): a tenant may have every attempt of its calls carry
Standard Webhooks headers over the request, so that a target verifies with its language's
`standardwebhooks` package that the request is the agent's and unaltered: `webhook-id`
(`<serviceCallId>.<attempt>`), `webhook-timestamp` and `webhook-signature` over
`id.timestamp.body` (core/signing.py). The secret is made when signing is first enabled and shown
once; a rotation signs with both the new and the old secret for 24 hours."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from core.errors import ValidationFailed
from core.ids import iso_ms, utcnow
from core.secrets import RotationResult, SecretUnavailable, rotate_sealed_columns, seal_value
from core.signing import ROTATION_OVERLAP_HOURS, live_secrets, new_signing_secret, signature
from execution.models import CallSigning
from execution.wire import HttpRequest, sent_body
from tenants.models import Tenant

# How long a process trusts what it read of the tenants' signing: enabling signing, or a
# rotation, reaches every worker within this.
CACHE_SECONDS = 1.0


@dataclass(frozen=True)
class SigningState:
    """What a tenant's signing is, as the API, pages, admin and command show it: never a secret."""

    enabled: bool
    secret_created_at: datetime | None = None
    previous_secret_until: datetime | None = None

    def as_wire(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "secretCreatedAt": iso_ms(self.secret_created_at),
            "previousSecretSignsUntil": iso_ms(self.previous_secret_until),
        }


def _state(row: CallSigning | None, *, now: datetime) -> SigningState:
    if row is None:
        return SigningState(enabled=False)
    until = (
        row.previous_secret_until
        if row.previous_secret and row.previous_secret_until and row.previous_secret_until > now
        else None
    )
    return SigningState(enabled=row.enabled, secret_created_at=row.secret_created_at, previous_secret_until=until)


def call_signing_get(*, tenant_id: str) -> SigningState:
    return _state(CallSigning.objects.filter(tenant_id=tenant_id).first(), now=utcnow())


def validate_signing(data: Any) -> tuple[bool, bool]:
    """`{"enabled": bool, "rotateSecret": bool?}` from the wire: (enabled, rotate). Raises
    ValidationFailed naming each bad field; unknown fields are refused."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ['A JSON object is required: {"enabled": true|false, "rotateSecret"?: true}.']})
    errors: dict[str, list[str]] = {}
    unknown = sorted(set(data) - {"enabled", "rotateSecret", "secretCreatedAt", "previousSecretSignsUntil"})
    for name in unknown:
        errors[name] = ["Unknown field."]
    enabled = data.get("enabled")
    if not isinstance(enabled, bool):
        errors["enabled"] = ["Required: true or false."]
    rotate = data.get("rotateSecret", False)
    if not isinstance(rotate, bool):
        errors["rotateSecret"] = ["true or false."]
    elif rotate and enabled is False:
        errors["rotateSecret"] = ["A secret is rotated only while signing is enabled."]
    if errors:
        raise ValidationFailed(errors)
    return enabled, rotate


def call_signing_set(*, tenant_id: str, enabled: bool, rotate: bool = False) -> tuple[SigningState, str | None]:
    """Turn the tenant's signed calls on or off, or rotate the secret (enabled only). Returns the
    state and the new secret, shown this once: on the first enabling and on a rotation; None
    otherwise (enabling again signs with the secret it had). After a rotation the previous secret
    signs too for ROTATION_OVERLAP_HOURS."""
    if rotate and not enabled:
        raise ValidationFailed({"rotateSecret": ["A secret is rotated only while signing is enabled."]})
    now = utcnow()
    shown = None
    with transaction.atomic():
        # The tenant's row first: two first enablings at once take turns (no signing row to lock yet).
        Tenant.objects.select_for_update().filter(pk=tenant_id).first()
        row = CallSigning.objects.select_for_update().filter(tenant_id=tenant_id).first()
        if row is None:
            if not enabled:
                return SigningState(enabled=False), None
            shown = new_signing_secret()
            row = CallSigning(tenant_id=tenant_id, secret=seal_value(shown), secret_created_at=now)
        elif rotate:
            shown = new_signing_secret()
            row.previous_secret, row.previous_secret_until = row.secret, now + timedelta(hours=ROTATION_OVERLAP_HOURS)
            row.secret, row.secret_created_at = seal_value(shown), now
        row.enabled = enabled
        row.updated_at = now
        row.save()
    signing_forget()
    return _state(row, now=now), shown


class _Cache:
    """The enabled tenants' sealed secrets, read once a CACHE_SECONDS for the whole process (one
    query of a table of a row per signing tenant), not once per attempt."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._rows: dict[str, tuple[Any, Any, datetime | None]] = {}

    def forget(self) -> None:
        with self._lock:
            self._read_at = float("-inf")

    def get(self, tenant_id: str) -> tuple[Any, Any, datetime | None] | None:
        with self._lock:
            if time.monotonic() - self._read_at > CACHE_SECONDS:
                self._rows = {
                    tenant: (secret, previous, until)
                    for tenant, secret, previous, until in CallSigning.objects.filter(enabled=True).values_list(
                        "tenant_id", "secret", "previous_secret", "previous_secret_until"
                    )
                }
                self._read_at = time.monotonic()
            return self._rows.get(tenant_id)


_cache = _Cache()


def signing_forget() -> None:
    """What this process read of the tenants' signing is read again at the next attempt."""
    _cache.forget()


def _new_cache_after_fork() -> None:
    # A fork while a thread held the cache's lock would leave it held for ever in the child.
    global _cache
    _cache = _Cache()


os.register_at_fork(after_in_child=_new_cache_after_fork)


def signed(request: HttpRequest, *, tenant_id: str, msg_id: str, at: datetime) -> HttpRequest:
    """`request` as it goes out for `tenant_id`: with the Standard Webhooks headers over its body
    when the tenant signs its calls (the agent's own headers, which replace any of the caller's of
    those names), unchanged when it does not. When the secret cannot be unsealed, a request that
    fails at once (`cannot_send`) rather than go out unsigned."""
    found = _cache.get(tenant_id)
    if found is None:
        return request
    secret, previous, until = found
    try:
        header = signature(
            live_secrets(secret, previous, until, at=at),
            msg_id=msg_id,
            at=at,
            body=(sent_body(request=request) or b"").decode(),
        )
    except SecretUnavailable as exc:
        return replace(
            request, cannot_send=f"The tenant signs its calls, and its signing secret cannot be unsealed: {exc}"
        )
    own = {"webhook-id": msg_id, "webhook-timestamp": str(int(at.timestamp())), "webhook-signature": header}
    return replace(request, agent_headers={**request.agent_headers, **own})


def signing_secrets_rotate(*, dry_run: bool = False) -> RotationResult:
    """The tenants' signing secrets re-encrypted under the first key of FIELD_ENCRYPTION_KEYS
    (manage.py rotate_secrets)."""
    rotated = rotate_sealed_columns(CallSigning.objects.all(), ("secret", "previous_secret"), dry_run=dry_run)
    _cache.forget()
    return rotated
