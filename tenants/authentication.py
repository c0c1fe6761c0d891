"""DRF authentication by `Authorization: Bearer <api key>`; the key names one tenant.

An address that keeps presenting bad keys has its bad keys refused for a while (429); a valid
key from it still passes: docs/security.md#6-deployment-hardening.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import caches
from rest_framework import authentication, exceptions

from tenants.selectors import api_key_lookup
from tenants.services import KEY_PREFIX, api_key_touch

THROTTLE_CACHE = "throttle"
_failures_lock = threading.Lock()


@dataclass(frozen=True)
class ApiKeyPrincipal:
    """The caller behind an API key: it acts for exactly one tenant."""

    tenant_id: str
    key_id: int
    is_authenticated: bool = True
    is_staff: bool = False
    is_superuser: bool = False
    username: str = ""

    @property
    def pk(self) -> str:
        return f"apikey:{self.key_id}"


def client_ip(request) -> str:
    """The client's address: the TCP peer, or with TRUSTED_PROXY_COUNT proxies in front, the
    entry the outermost of them appended to X-Forwarded-For (what a client sends sits left of it).

    Also django-axes' AXES_CLIENT_IP_CALLABLE, so logins and API keys count the same address.
    """
    count = settings.TRUSTED_PROXY_COUNT
    if count:
        hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
        if len(hops) >= count:
            return hops[-count]
    return request.META.get("REMOTE_ADDR", "")


def _failures_key(address: str) -> str:
    return f"api-key-failures:{address}"


def api_key_failures_wait(*, address: str) -> float:
    """Seconds until this address may try keys again; 0 when it may now."""
    entry = caches[THROTTLE_CACHE].get(_failures_key(address))
    if entry is None:
        return 0.0
    count, window_end = entry
    remaining = window_end - time.time()
    return remaining if count >= settings.API_KEY_FAILURE_LIMIT and remaining > 0 else 0.0


def api_key_failure_record(*, address: str) -> None:
    """Count one failed authentication in the address's window (opened by its first failure)."""
    cache = caches[THROTTLE_CACHE]
    key = _failures_key(address)
    now = time.time()
    # The cache is per process; the lock keeps this process's count exact under threads.
    with _failures_lock:
        entry = cache.get(key)
        if entry is None or entry[1] <= now:
            entry = (0, now + settings.API_KEY_FAILURE_WINDOW_SECONDS)
        count, window_end = entry[0] + 1, entry[1]
        cache.set(key, (count, window_end), timeout=max(1, math.ceil(window_end - now)))


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if not parts:  # only whitespace
            return None
        # The scheme is case-insensitive (RFC 9110 §11.1). A bare key is a mistake worth naming;
        # another scheme (a proxy's Basic login) is left to the session, and a request that no
        # authentication takes is told the form to use (eventservice.api.errors).
        if parts[0].lower() != self.keyword.lower():
            if parts[0].startswith(KEY_PREFIX):
                raise exceptions.AuthenticationFailed(
                    'Put "Bearer " before the API key: the header is "Authorization: Bearer <api key>".'
                )
            return None
        key = api_key_lookup(raw_key=parts[1]) if len(parts) == 2 else None
        if key is not None:
            # A valid key always passes, throttled address or not: behind a proxy or NAT every
            # tenant shares one address, and refusing good keys would let anyone lock them all
            # out. Keys carry 256 random bits, so a guesser learns nothing from this.
            api_key_touch(api_key=key)
            return ApiKeyPrincipal(tenant_id=key.tenant_id, key_id=key.pk), key
        address = client_ip(request)
        wait = api_key_failures_wait(address=address)
        if wait:
            raise exceptions.Throttled(
                wait=math.ceil(wait),
                detail="Too many failed API key authentications from your address; try again later.",
            )
        api_key_failure_record(address=address)
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        raise exceptions.AuthenticationFailed("Unknown or revoked API key.")

    def authenticate_header(self, request) -> str:
        return self.keyword
