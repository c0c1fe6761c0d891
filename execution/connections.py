"""Connections (docs/connections.md): a tenant's named credentials, which a call or a schedule
names in `requestSpec.connection` so that each attempt carries them (EventBridge API
destinations' connections). Three kinds: `basic` (a user name and a password), `apiKeyHeader` (a
header's name and value) and `oauth2ClientCredentials` (a token endpoint the agent asks for a
bearer token: execution/credentials.py).

Each kind has one secret (the password, the header's value, the client secret), sealed like a
secret header and never shown again, not even in the answer that stores it; the rest is shown.
Checked, stored, changed and deleted here for the API, the page, the admin and `manage.py
connections` alike. A connection that a live call or a schedule names is not deleted: the
modules that store those register a reader of their own (USAGE_READERS, filled in
eventservice/apps.py), as execution may not import them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from core.errors import Conflict, NotFound, ValidationFailed
from core.ids import iso_ms, new_id, utcnow
from core.secrets import RotationResult, rotate_sealed_columns, seal_value
from core.text import CONTROL, NOT_VISIBLE, first_of
from execution.egress import header_key
from execution.models import Connection, ConnectionToken
from execution.targets import header_name_error, header_value_error, url_error
from tenants.models import Tenant

Kind = Connection.Kind

# Lone UTF-16 surrogates (a JSON "\ud800"): no encoder takes them, not the sealing of a secret
# nor the Basic header's encoding.
UNPAIRED = frozenset({"Cs"})
# A name goes in URLs (/connections/<name>) and in request specs: letters, digits, ".", "_", "-".
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # as the OpenAPI schema says it
NAME_RE = re.compile(NAME_PATTERN[:-1] + r"\Z")  # \Z: "$" would let a trailing newline through
NAME_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
MAX_CONNECTIONS = 100
MAX_TEXT = 256
MAX_SECRET = 4096
# How the client authenticates at the token endpoint (RFC 6749 §2.3.1): HTTP Basic, which every
# server must accept (the default), or the client id and secret in the form body.
CLIENT_AUTH = ("basic", "body")

# Per kind: the fields shown (the required ones first, then the optional ones) and its secret.
SHOWN = {
    Kind.BASIC: (("username",), ()),
    Kind.API_KEY_HEADER: (("headerName",), ()),
    Kind.OAUTH2_CLIENT_CREDENTIALS: (("tokenUrl", "clientId"), ("scope", "audience", "clientAuth")),
}
SECRET = {Kind.BASIC: "password", Kind.API_KEY_HEADER: "headerValue", Kind.OAUTH2_CLIENT_CREDENTIALS: "clientSecret"}
_READ_ONLY = ("createdAt", "updatedAt", "secretUpdatedAt")

# Readers of what names a connection: (tenant, name) -> a few descriptions ("call 0190...",
# "schedule 'nightly' (0190...)"). Filled by eventservice/apps.py with orchestration's and
# schedules' own.
USAGE_READERS: list[Callable[[str, str], list[str]]] = []


@dataclass(frozen=True)
class ConnectionInput:
    """A create or a change, checked: the fields given, by their wire names."""

    name: str | None
    kind: str | None
    config: dict[str, Any]  # the shown fields given (None: an optional one cleared)
    secret: str | None  # None: not given (a change keeps the secret it had)


def header_set_by(kind: str, config: dict[str, Any]) -> str:
    """The header a connection of `kind` sets on each attempt."""
    return config["headerName"] if kind == Kind.API_KEY_HEADER else "Authorization"


def _text(value: Any, field: str, errors: dict[str, list[str]], *, required: bool, limit: int = MAX_TEXT) -> Any:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        errors[field] = ["Required: a non-empty string." if required else "A non-empty string, or null."]
    elif len(value) > limit:
        errors[field] = [f"At most {limit} characters."]
    elif (ch := first_of(value, (NOT_VISIBLE if field != "scope" else CONTROL) | UNPAIRED)) is not None:
        errors[field] = [f"Must not contain whitespace, control, invisible or unpaired characters (U+{ord(ch):04X})."]
    return value


def _config_field(kind: str, field: str, value: Any, errors: dict[str, list[str]]) -> Any:
    required = field in SHOWN[kind][0]
    if field == "username":
        value = _text(value, field, errors, required=required)
        if field not in errors and ":" in value:
            errors[field] = ["A user name may not contain ':' (RFC 7617)."]
    elif field == "headerName":
        problem = header_name_error(value)
        if problem is None and (
            header_key(value) in {"host", "content-type"} or header_key(value).startswith("webhook-")
        ):
            problem = f"Header {value!r} is not a credential (the agent's signed calls set the webhook-* headers)."
        if problem is not None:
            errors[field] = [problem]
    elif field == "tokenUrl":
        if (problem := url_error(value)) is not None:
            errors[field] = [problem]
    elif field == "clientAuth":
        if value is None:
            return "basic"
        if value not in CLIENT_AUTH:
            errors[field] = ['One of "basic" (HTTP Basic, the default) or "body" (in the form body).']
    elif field == "scope":
        value = _text(value, field, errors, required=False, limit=1024)
        if value is not None and field not in errors:
            value = " ".join(value.split())
    else:
        value = _text(value, field, errors, required=required, limit=2048 if field == "audience" else MAX_TEXT)
    return value


def _secret_problem(kind: str, value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return "Required: a non-empty string."
    if len(value) > MAX_SECRET:
        return f"At most {MAX_SECRET} characters."
    if kind == Kind.API_KEY_HEADER:
        return header_value_error("headerValue", value)
    if (ch := first_of(value, CONTROL | UNPAIRED)) is not None:
        return f"Must not contain control or unpaired surrogate characters (U+{ord(ch):04X})."
    return None


def validate_connection(data: Any, *, existing: Connection | None = None) -> ConnectionInput:
    """A create (`existing` None: name, kind, the kind's required fields and its secret) or a
    change of `existing` (any of its shown fields, and its secret to rotate it; the name and the
    kind stay), from the wire. Raises ValidationFailed naming each bad field."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["A JSON object is required."]})
    errors: dict[str, list[str]] = {}
    kind = existing.kind if existing is not None else data.get("kind")
    if existing is None and kind not in Kind.values:
        errors["kind"] = [f"Required: one of {', '.join(Kind.values)}."]
        raise ValidationFailed(errors)
    required, optional = SHOWN[kind]
    known = {"name", "kind", *required, *optional, SECRET[kind], *_READ_ONLY}
    for field in sorted(set(data) - known):
        errors[field] = [f"Unknown field for a {kind} connection."]
    name = data.get("name")
    if existing is None:
        if not isinstance(name, str) or not NAME_RE.match(name):
            errors["name"] = [f"Required: {NAME_RULE}."]
    else:
        for field, value in (("name", existing.name), ("kind", existing.kind)):
            if field in data and data[field] != value:
                errors[field] = [f"The {field} of a connection cannot change; make a new connection."]
        name = None
    config = {}
    for field in (*required, *optional):
        if field in data or (existing is None and field in required):
            config[field] = _config_field(kind, field, data.get(field), errors)
        elif existing is None and field == "clientAuth":
            config[field] = "basic"
    secret = data.get(SECRET[kind])
    # The client secret goes wherever the token URL says: a new URL takes the secret anew, so that
    # who may change a connection cannot send its stored secret somewhere else.
    moved = existing is not None and "tokenUrl" in config and config["tokenUrl"] != existing.config.get("tokenUrl")
    if moved and SECRET[kind] not in data:
        errors["clientSecret"] = ["Give the client secret again with a new tokenUrl."]
    if (SECRET[kind] in data or existing is None) and (problem := _secret_problem(kind, secret)) is not None:
        errors[SECRET[kind]] = [problem]
    if errors:
        raise ValidationFailed(errors)
    return ConnectionInput(name=name, kind=None if existing else kind, config=config, secret=secret)


def connection_wire(connection: Connection) -> dict[str, Any]:
    """A connection as the API, the pages and the command show it: never its secret."""
    required, optional = SHOWN[connection.kind]
    return {
        "name": connection.name,
        "kind": connection.kind,
        **{field: connection.config.get(field) for field in (*required, *optional)},
        "createdAt": iso_ms(connection.created_at),
        "updatedAt": iso_ms(connection.updated_at),
        "secretUpdatedAt": iso_ms(connection.secret_updated_at),
    }


def connections_list(*, tenant_id: str) -> list[Connection]:
    return list(Connection.objects.filter(tenant_id=tenant_id).order_by("name"))


def connection_get(*, tenant_id: str, name: str) -> Connection:
    found = Connection.objects.filter(tenant_id=tenant_id, name=name).first() if isinstance(name, str) else None
    if found is None:
        raise NotFound(f"No connection named {str(name)[:64]!r}.")
    return found


def _locked(tenant_id: str, name: str) -> Connection:
    """The tenant's connection of that name, its row locked (inside a transaction); NotFound else."""
    found = Connection.objects.select_for_update().filter(tenant_id=tenant_id, name=name).first()
    if found is None:
        raise NotFound(f"No connection named {str(name)[:64]!r}.")
    return found


def connection_create(*, tenant_id: str, data: ConnectionInput) -> Connection:
    now = utcnow()
    with transaction.atomic():
        # The tenant's row, locked: two creates never both take the last place.
        Tenant.objects.select_for_update().filter(pk=tenant_id).first()
        if Connection.objects.filter(tenant_id=tenant_id).count() >= MAX_CONNECTIONS:
            raise ValidationFailed({"body": [f"A tenant may have at most {MAX_CONNECTIONS} connections."]})
        connection = Connection(
            connection_id=new_id(),
            tenant_id=tenant_id,
            name=data.name,
            kind=data.kind,
            config=data.config,
            secret=seal_value(data.secret),
            created_at=now,
            updated_at=now,
            secret_updated_at=now,
        )
        try:
            with transaction.atomic():
                connection.save(force_insert=True)
        except IntegrityError:
            raise Conflict(f"A connection named {data.name!r} exists already.") from None
    return connection


def connection_update(*, tenant_id: str, name: str, data: ConnectionInput) -> Connection:
    """Change the shown fields given and, when given, the secret. Takes effect for the next
    attempt: the version rises, so no token fetched before is used again."""
    now = utcnow()
    with transaction.atomic():
        connection = _locked(tenant_id, name)
        config = {**connection.config, **data.config}
        if connection.kind == Kind.OAUTH2_CLIENT_CREDENTIALS and config.get("clientAuth") is None:
            config["clientAuth"] = "basic"
        connection.config = {key: value for key, value in config.items() if value is not None}
        if data.secret is not None:
            connection.secret = seal_value(data.secret)
            connection.secret_updated_at = now
        connection.version += 1
        connection.updated_at = now
        connection.save()
        ConnectionToken.objects.filter(connection_id=connection.pk).delete()
    return connection


def connection_users(*, tenant_id: str, name: str) -> list[str]:
    """What names the connection and keeps it: the live calls and the schedules, a few of each."""
    return [user for reader in USAGE_READERS for user in reader(tenant_id, name)]


def connection_delete(*, tenant_id: str, name: str) -> None:
    """Delete a connection that nothing live names; Conflict (409) naming what does otherwise."""
    with transaction.atomic():
        connection = _locked(tenant_id, name)
        users = connection_users(tenant_id=tenant_id, name=name)
        if users:
            raise Conflict(f"Connection {name!r} is in use by {', '.join(users)}: cancel or change them first.")
        connection.delete()


def connection_check(*, tenant_id: str, name: str | None, header_names: Iterable[str], field: str) -> None:
    """A call's or schedule's `requestSpec.connection` (`field`, the wire name): the tenant has a
    connection of that name, and the request does not set the header it sets. ValidationFailed
    naming the field otherwise."""
    if name is None:
        return
    connection = Connection.objects.filter(tenant_id=tenant_id, name=name).only("kind", "config").first()
    if connection is None:
        raise ValidationFailed({field: [f"No connection named {name!r}: make it first (docs/connections.md)."]})
    header = header_set_by(connection.kind, connection.config)
    if any(header_key(given) == header_key(header) for given in header_names):
        raise ValidationFailed(
            {field.rsplit(".", 1)[0] + ".headers": [f"Header {header!r} is set by connection {name!r}; remove it."]}
        )


def connection_reference_error(name: Any) -> str | None:
    """Why `name` cannot be a `requestSpec.connection`, or None (its format only; whether the
    tenant has it: connection_check)."""
    if name is None:
        return None
    if not isinstance(name, str) or not NAME_RE.match(name):
        return f"A connection's name: {NAME_RULE}."
    return None


def connection_secrets_rotate(*, dry_run: bool = False) -> RotationResult:
    """The connections' secrets re-encrypted under the first key of FIELD_ENCRYPTION_KEYS (manage.py
    rotate_secrets). Their cached tokens, sealed under the old key, are forgotten: the next
    attempt fetches a token anew."""
    rotated = rotate_sealed_columns(Connection.objects.all(), ("secret",), dry_run=dry_run)
    if not dry_run:
        ConnectionToken.objects.all().delete()
    return rotated
