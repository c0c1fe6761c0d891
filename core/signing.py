"""Standard Webhooks signatures (https://www.standardwebhooks.com), made with the
`standardwebhooks` library: the secrets (`whsec_` + base64 of 32 random bytes), sealed at rest
like secret headers (core.secrets), and the `webhook-signature` header over `id.timestamp.body`.
Webhook deliveries (delivery/channels/webhook.py) and signed calls (execution/signing.py) sign
with it, so a receiver verifies both with its own language's `standardwebhooks` package."""

from __future__ import annotations

import base64
import functools
import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings

from core.secrets import unseal_value

if TYPE_CHECKING:
    from standardwebhooks.webhooks import Webhook

# How long a rotated-out secret still signs beside the new one, so that receivers can switch
# whenever they like within it.
ROTATION_OVERLAP_HOURS = 24


def new_signing_secret() -> str:
    """`whsec_` + base64 of 32 random bytes (Standard Webhooks)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def live_secrets(secret: Any, previous: Any, previous_until: datetime | None, *, at: datetime) -> list[Any]:
    """The sealed secrets that sign at `at`: the current one, and the previous one until its
    overlap ends."""
    if previous and previous_until and previous_until > at:
        return [secret, previous]
    return [secret]


def signature(sealed: Iterable[Any], *, msg_id: str, at: datetime, body: str) -> str:
    """`v1,<base64>`, one per sealed secret, space-separated. Raises core.secrets.
    SecretUnavailable when a secret cannot be unsealed with any configured key."""
    keys = (tuple(settings.FIELD_ENCRYPTION_KEYS), settings.SECRET_KEY)
    return " ".join(
        _signer(tuple(secret.items()), keys).sign(msg_id=msg_id, timestamp=at, data=body) for secret in sealed
    )


@functools.lru_cache(maxsize=1024)
def _signer(sealed: tuple[tuple[str, str], ...], keys: tuple[tuple[str, ...], str]) -> Webhook:
    """The signer of a sealed secret under the sealing `keys` (core/secrets.py), unsealed once
    per process rather than once per signature: Fernet's decryption was a tenth of a webhook
    try. A sealed value unseals to the same secret under the same keys, and a rotated secret is
    another sealed value; a failure to unseal is not cached."""
    from standardwebhooks.webhooks import Webhook  # loaded with the first signature

    return Webhook(unseal_value(dict(sealed)))
