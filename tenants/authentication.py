"""DRF authentication by `Authorization: Bearer <api key>`; the key names one tenant."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import authentication, exceptions

from tenants.selectors import api_key_lookup


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


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if parts[0] != self.keyword:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        key = api_key_lookup(raw_key=parts[1])
        if key is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.")
        return ApiKeyPrincipal(tenant_id=key.tenant_id, key_id=key.pk), key

    def authenticate_header(self, request) -> str:
        return self.keyword
