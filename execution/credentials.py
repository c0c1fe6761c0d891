"""What a call's connection adds to each attempt (docs/connections.md).

When the attempt is claimed (`credentials_for`, one query for the chunk of calls started
together) the connection is read afresh, so a change or a rotation takes effect for the next
attempt: a `basic` or `apiKeyHeader` connection sets its header then; an
`oauth2ClientCredentials` one sets `Authorization` when the request is sent (`send`), with a
bearer token from its token endpoint.

The token is asked for with the client-credentials grant through the same egress policy and
bounded transport as the call itself (execution.http.perform); the request body and the answer
are oauthlib's (BackendApplicationClient: it builds and parses, and sends nothing, which is why
it is used rather than a client that brings its own HTTP). A token is kept until shortly before
it expires: in this process, and sealed in `connection_tokens`, shared by every process and
cluster on the database (a token is independent of any other: two processes that fetch one at
once each use theirs, and the last one stored is the one shared). A target's 401 fetches the
token once more and sends the request once more, within the same attempt; the attempt log shows
the earlier try and the connection's name, never a token. A token endpoint that fails fails the
attempt with `CredentialError`, retried under the call's retry policy like any failure it names.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from django.db import Error as DatabaseError
from django.db import transaction
from django.db.models import Q
from oauthlib.oauth2 import BackendApplicationClient, OAuth2Error

from core.db import pool_release
from core.ids import utcnow
from core.secrets import SecretUnavailable, seal_value, unseal_value
from execution.connections import Kind, header_set_by
from execution.http import perform
from execution.messages import scrub
from execution.models import Connection, ConnectionToken
from execution.outcomes import ErrorKind, Outcome
from execution.wire import HttpRequest

# A token is not used in its last TOKEN_MARGIN (nor in the last tenth of a short life): a request
# sent with it must still find it valid at the target. One without `expires_in` is kept this long
# at most (and until a 401).
TOKEN_MARGIN = timedelta(seconds=30)
TOKEN_UNSTATED_LIFE = timedelta(hours=1)
TOKEN_LONGEST_LIFE = timedelta(days=1)
# What a bearer token may be (RFC 6750's b64token, generously: any visible ASCII).
_TOKEN_TEXT = re.compile(r"[\x21-\x7e]{1,65536}")
# How long the token endpoint has to answer, and how much of its answer is read (a token with
# many claims is several KiB, more than an attempt's snippet).
TOKEN_TIMEOUT_MS = 10_000
TOKEN_ANSWER_BYTES = 64 * 1024
# What the attempt log shows for the header an OAuth2 connection sets before the token is known.
PENDING = "Bearer (fetched when sent)"


@dataclass(frozen=True)
class Credential:
    """A connection as one attempt uses it: plaintext, in memory only."""

    name: str
    header: str = "Authorization"
    value: str | None = None  # basic / apiKeyHeader: the header's value
    connection_id: uuid.UUID | None = None
    version: int = 0
    config: dict[str, Any] | None = None  # oauth2ClientCredentials: the token endpoint and client
    client_secret: str | None = None
    problem: str | None = None  # why it gives no credentials: the attempt fails, nothing sent
    # What a target must never be seen to echo: the header's value and its parts (a Basic
    # credential's encoded and decoded pair, the password).
    secrets: tuple[str, ...] = ()


class CredentialFailure(Exception):
    """The token endpoint gave no token; the message says why, without a secret."""


def _credential(connection: Connection) -> Credential:
    try:
        secret = unseal_value(connection.secret)
    except SecretUnavailable as exc:
        return Credential(name=connection.name, problem=f"connection {connection.name!r}: its secret {exc}")
    header = header_set_by(connection.kind, connection.config)
    if connection.kind == Kind.BASIC:
        pair = f"{connection.config['username']}:{secret}"
        value = "Basic " + base64.b64encode(pair.encode()).decode()
        return Credential(name=connection.name, value=value, secrets=(value, value[6:], pair, secret))
    if connection.kind == Kind.API_KEY_HEADER:
        return Credential(name=connection.name, header=header, value=secret, secrets=(secret,))
    return Credential(
        name=connection.name,
        connection_id=connection.connection_id,
        version=connection.version,
        config=dict(connection.config),
        client_secret=secret,
    )


def credentials_for(wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Credential]:
    """The credentials of the (tenant, connection name) pairs, read now in one query; a pair
    whose connection is gone gets a Credential that fails its attempt."""
    wanted = set(wanted)
    if not wanted:
        return {}
    match = Q()
    for tenant_id, name in wanted:
        match |= Q(tenant_id=tenant_id, name=name)
    found = {(c.tenant_id, c.name): _credential(c) for c in Connection.objects.filter(match)}
    gone = "connection {!r} does not exist (deleted after the call was made); nothing was sent"
    return {pair: found.get(pair) or Credential(name=pair[1], problem=gone.format(pair[1])) for pair in wanted}


def with_credential(request: HttpRequest, credential: Credential) -> HttpRequest:
    """`request` carrying the connection's header (the agent's own: it replaces none of the
    caller's, which may not set it). An OAuth2 connection's header is set when sent."""
    if credential.problem is not None:
        return replace(request, credential=credential)
    value = credential.value if credential.config is None else PENDING
    return replace(
        request,
        agent_headers={**request.agent_headers, credential.header: value},
        credential=credential,
        secrets=(
            *request.secrets,
            *credential.secrets,
            *((credential.client_secret,) if credential.client_secret else ()),
        ),
    )


def send(request: HttpRequest) -> Outcome:
    """Send `request` once (execution.http.perform), with its connection's credentials: for an
    OAuth2 connection a bearer token, fetched again and the request sent once more after a 401.
    The token's fetches and both sends share the attempt's one deadline (`timeoutMs`)."""
    credential: Credential | None = request.credential
    if credential is None or (credential.config is None and credential.problem is None):
        return perform(request)
    if credential.problem is not None:
        return Outcome.failure(ErrorKind.CREDENTIAL_ERROR, credential.problem)
    deadline = time.monotonic() + request.timeout_ms / 1000

    def within(outgoing: HttpRequest) -> HttpRequest | None:
        left = int((deadline - time.monotonic()) * 1000)
        return replace(outgoing, timeout_ms=left) if left > 0 else None

    def late() -> Outcome:
        return Outcome.failure(ErrorKind.TIMEOUT, f"no complete response within {request.timeout_ms} ms")

    try:
        token = _tokens.current(credential, deadline=deadline)
    except CredentialFailure as exc:
        return Outcome.failure(ErrorKind.CREDENTIAL_ERROR, str(exc))
    first_try = within(_bearer(request, token))
    if first_try is None:
        return late()
    first = perform(first_try)
    if first.status != 401:
        return first
    earlier = (
        {
            "status": 401,
            "latencyMs": first.latency_ms,
            "note": f"The target refused the token of connection {credential.name!r}: fetched again, sent again.",
        },
    )
    try:
        fresh = _tokens.refresh(credential, stale=token, deadline=deadline)
    except CredentialFailure as exc:
        return replace(Outcome.failure(ErrorKind.CREDENTIAL_ERROR, str(exc)), earlier_tries=earlier)
    # The refused token stays among the values scrubbed from what the target answers.
    second_try = within(_bearer(replace(request, secrets=(*request.secrets, token)), fresh))
    return replace(perform(second_try) if second_try else late(), earlier_tries=earlier)


def _bearer(request: HttpRequest, token: str) -> HttpRequest:
    return replace(
        request,
        agent_headers={**request.agent_headers, "Authorization": f"Bearer {token}"},
        secrets=(*request.secrets, token),
    )


def fetch_token(credential: Credential, *, deadline: float | None = None) -> tuple[str, datetime]:
    """Ask the connection's token endpoint for a token (the client-credentials grant, RFC 6749
    §4.4), within TOKEN_TIMEOUT_MS and the attempt's `deadline`: (the token, until when to use
    it). Raises CredentialFailure."""
    config = credential.config or {}
    client = BackendApplicationClient(config["clientId"])
    extra = {"audience": config["audience"]} if config.get("audience") else {}
    in_body = config.get("clientAuth") == "body"
    body = client.prepare_request_body(
        scope=config.get("scope") or None,
        include_client_id=in_body,
        **({"client_secret": credential.client_secret} if in_body else {}),
        **extra,
    )
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
    if not in_body:  # RFC 6749 §2.3.1: each part form-encoded, then Basic
        pair = f"{quote(config['clientId'], safe='')}:{quote(credential.client_secret or '', safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    where = f"connection {credential.name!r}: the token endpoint"
    timeout_ms = TOKEN_TIMEOUT_MS
    if deadline is not None:
        timeout_ms = min(timeout_ms, int((deadline - time.monotonic()) * 1000))
        if timeout_ms <= 0:
            raise CredentialFailure(f"{where} was not asked: the attempt's time ran out")
    secrets = [credential.client_secret or ""]
    request = HttpRequest(
        method="POST", url=config["tokenUrl"], headers=headers, body=body, timeout_ms=timeout_ms, secrets=tuple(secrets)
    )
    asked = utcnow()
    outcome = perform(request, keep_bytes=TOKEN_ANSWER_BYTES)
    if outcome.status is None:
        raise CredentialFailure(f"{where} gave no answer ({outcome.error_kind}: {outcome.error_message})")
    if outcome.body_truncated:
        raise CredentialFailure(f"{where} answered {outcome.status} with a body too long to be a token answer")
    try:
        token = client.parse_request_body_response(outcome.body_snippet or "", scope=config.get("scope") or None)
    except Warning as changed:  # another scope than asked for: the token is the endpoint's to give
        token = getattr(changed, "token", None) or {}
    except OAuth2Error as exc:
        said = scrub(f"{exc.error}: {exc.description}", secrets)[:300]
        raise CredentialFailure(f"{where} answered {outcome.status} without a token ({said})") from None
    except Exception as exc:  # not a token answer at all (JSON of another shape, a number out of range)
        said = scrub(f"{type(exc).__name__}: {exc}", secrets)[:300]
        raise CredentialFailure(f"{where} answered {outcome.status} without a token ({said})") from None
    if not outcome.succeeded:
        raise CredentialFailure(f"{where} answered {outcome.status}")
    access = token.get("access_token") if isinstance(token, dict) else None
    if not isinstance(access, str) or not _TOKEN_TEXT.fullmatch(access):
        raise CredentialFailure(f"{where} answered {outcome.status} without a usable access_token")
    if str(token.get("token_type", "Bearer")).lower() != "bearer":
        raise CredentialFailure(f"{where} gave a {str(token.get('token_type'))[:40]!r} token, not a bearer token")
    return access, asked + _life(token.get("expires_in"))


def _life(expires_in: Any) -> timedelta:
    """How long to use a token stated to live `expires_in` seconds: until TOKEN_MARGIN before it
    expires (a tenth of a short life), at most TOKEN_LONGEST_LIFE; TOKEN_UNSTATED_LIFE when the
    endpoint says nothing (or nonsense); nothing for one already expired (used once, not kept)."""
    try:
        seconds = min(float(expires_in), TOKEN_LONGEST_LIFE.total_seconds())
    except (TypeError, ValueError, OverflowError):
        return TOKEN_UNSTATED_LIFE
    if seconds != seconds or seconds <= 0:  # NaN, or already expired
        return timedelta(0)
    life = timedelta(seconds=seconds)
    return life - min(TOKEN_MARGIN, life / 10)


class _Tokens:
    """The tokens of this process, in front of the shared `connection_tokens`: one fetch at a
    time per connection in this process (the other threads wait for its token). It is read and
    written from the engine's execution threads, which otherwise use no database connection: each
    gives its pooled connection back at once (core.db.pool_release), and a database that does not
    answer only costs a fetch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[uuid.UUID, tuple[int, str, datetime]] = {}
        self._fetching: dict[uuid.UUID, threading.Lock] = {}

    def _usable(self, credential: Credential, *, not_this: str | None = None) -> str | None:
        now = utcnow()
        held = self._held.get(credential.connection_id)
        if held and held[0] == credential.version and held[2] > now and held[1] != not_this:
            return held[1]
        try:
            row = ConnectionToken.objects.filter(
                connection_id=credential.connection_id, version=credential.version, use_until__gt=now
            ).first()
        except DatabaseError:  # the database away (or no pooled connection free): fetch one
            return None
        finally:
            pool_release()
        if row is None:
            return None
        try:
            token = unseal_value(row.token)
        except SecretUnavailable:
            return None
        if token == not_this:
            return None
        self._held[credential.connection_id] = (credential.version, token, row.use_until)
        return token

    def _fetch_lock(self, connection_id: uuid.UUID) -> threading.Lock:
        with self._lock:
            return self._fetching.setdefault(connection_id, threading.Lock())

    def current(self, credential: Credential, *, deadline: float | None = None) -> str:
        held = self._held.get(credential.connection_id)
        if held and held[0] == credential.version and held[2] > utcnow():
            return held[1]
        with self._fetch_lock(credential.connection_id):
            return self._usable(credential) or self._fetch(credential, deadline=deadline)

    def refresh(self, credential: Credential, *, stale: str, deadline: float | None = None) -> str:
        """A token other than `stale`: one another thread or process fetched meanwhile, or a new one."""
        with self._fetch_lock(credential.connection_id):
            if self._held.get(credential.connection_id, (0, None))[1] == stale:
                self._held.pop(credential.connection_id, None)
            return self._usable(credential, not_this=stale) or self._fetch(credential, deadline=deadline)

    def _fetch(self, credential: Credential, *, deadline: float | None = None) -> str:
        token, use_until = fetch_token(credential, deadline=deadline)
        if use_until <= utcnow():  # expired already: used for this attempt, not kept
            return token
        self._held[credential.connection_id] = (credential.version, token, use_until)
        try:
            with transaction.atomic():
                ConnectionToken.objects.update_or_create(
                    connection_id=credential.connection_id,
                    defaults={
                        "version": credential.version,
                        "token": seal_value(token),
                        "fetched_at": utcnow(),
                        "use_until": use_until,
                    },
                )
        except DatabaseError:
            # The connection was deleted meanwhile, or the database is away: the token is good,
            # this process uses it, and the next fetch stores one.
            pass
        finally:
            pool_release()
        return token

    def forget(self) -> None:
        with self._lock:
            self._held.clear()


_tokens = _Tokens()


def tokens_forget() -> None:
    """What this process holds of the tokens is read again (tests, after a change elsewhere)."""
    _tokens.forget()


def _new_tokens_after_fork() -> None:
    # A fork while a thread held a lock would leave it held for ever in the child.
    global _tokens
    _tokens = _Tokens()


os.register_at_fork(after_in_child=_new_tokens_after_fork)
