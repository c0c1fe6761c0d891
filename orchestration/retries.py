"""Retry policies: which failed attempts are tried again, and when (docs/retries.md).

A call carries an optional policy, named after Cloud Tasks' RetryConfig. After a failed
attempt that the policy calls retryable, with attempts left, the call goes back to
Scheduled, due after a backoff that doubles from `minBackoffMs` to `maxBackoffMs` with
±10 % jitter; a `Retry-After` the target sent is honoured up to `maxBackoffMs`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from execution.outcomes import ErrorKind, Outcome

MAX_ATTEMPTS = 20
DEFAULT_MIN_BACKOFF_MS = 1_000
DEFAULT_MAX_BACKOFF_MS = 60_000
# A backoff is a delay before the next attempt: at least 100 ms, at most one day.
BACKOFF_FLOOR_MS = 100
BACKOFF_CEILING_MS = 24 * 3600 * 1000
JITTER = 0.10


class RetryOn:
    """The failures a policy may name; anything else is never retried."""

    HTTP_5XX = "HttpError5xx"
    HTTP_429 = "Http429"
    TIMEOUT = "Timeout"
    NETWORK_ERROR = "NetworkError"
    # The call's connection gave no credentials (its OAuth2 token endpoint failed: docs/connections.md).
    CREDENTIAL_ERROR = "CredentialError"
    ALL = (HTTP_5XX, HTTP_429, TIMEOUT, NETWORK_ERROR, CREDENTIAL_ERROR)


# delay-seconds (RFC 9110 §10.2.3): ASCII digits only; str.isdigit() would also take "²", which
# int() refuses. Ten digits are already centuries.
_DELAY_SECONDS = re.compile(r"[0-9]{1,10}")

FIELDS = ("maxAttempts", "minBackoffMs", "maxBackoffMs", "retryOn", "retryInterrupted")


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 1
    min_backoff_ms: int = DEFAULT_MIN_BACKOFF_MS
    max_backoff_ms: int = DEFAULT_MAX_BACKOFF_MS
    retry_on: tuple[str, ...] = RetryOn.ALL
    retry_interrupted: bool = False
    # Whether the submission named its minBackoffMs (not stored): a default under the operator's
    # floor is raised to it, a value asked for is refused (docs/retries.md, "Operator ceilings").
    min_backoff_given: bool = field(default=True, compare=False)

    def as_wire(self) -> dict[str, Any]:
        """The camelCase form the API shows and the call row stores."""
        return {
            "maxAttempts": self.max_attempts,
            "minBackoffMs": self.min_backoff_ms,
            "maxBackoffMs": self.max_backoff_ms,
            "retryOn": list(self.retry_on),
            "retryInterrupted": self.retry_interrupted,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any] | None) -> RetryPolicy:
        """A stored policy (already validated); None is the default: one attempt."""
        if not data:
            return cls()
        return cls(
            max_attempts=data.get("maxAttempts", 1),
            min_backoff_ms=data.get("minBackoffMs", DEFAULT_MIN_BACKOFF_MS),
            max_backoff_ms=data.get("maxBackoffMs", DEFAULT_MAX_BACKOFF_MS),
            retry_on=tuple(data.get("retryOn", RetryOn.ALL)),
            retry_interrupted=bool(data.get("retryInterrupted", False)),
        )


def policy_errors(raw: Any) -> tuple[RetryPolicy | None, dict[str, list[str]]]:
    """Check a `retryPolicy` in the wire shape: (policy, {}) or (None, {field: [messages]})."""
    errors: dict[str, list[str]] = {}

    def add(name: str, message: str) -> None:
        errors.setdefault(f"retryPolicy.{name}" if name else "retryPolicy", []).append(message)

    if raw is None:
        return None, {}
    if not isinstance(raw, dict):
        add(
            "",
            "retryPolicy must be an object: {maxAttempts, minBackoffMs?, maxBackoffMs?, retryOn?, retryInterrupted?}.",
        )
        return None, errors
    unknown = sorted(str(key)[:40] for key in set(raw) - set(FIELDS))
    if unknown:
        add("", f"Unknown fields: {', '.join(unknown)}.")

    def integer(name: str, default: int, low: int, high: int) -> int:
        value = raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            add(name, f"{name} must be an integer from {low} to {high}.")
            return default
        return value

    max_attempts = integer("maxAttempts", 1, 1, MAX_ATTEMPTS)
    min_backoff = integer("minBackoffMs", DEFAULT_MIN_BACKOFF_MS, BACKOFF_FLOOR_MS, BACKOFF_CEILING_MS)
    max_default = max(DEFAULT_MAX_BACKOFF_MS, min_backoff)
    max_backoff = integer("maxBackoffMs", max_default, BACKOFF_FLOOR_MS, BACKOFF_CEILING_MS)
    if min_backoff > max_backoff:
        add("minBackoffMs", "minBackoffMs must not be greater than maxBackoffMs.")

    retry_on = raw.get("retryOn", list(RetryOn.ALL))
    if not isinstance(retry_on, list) or not all(isinstance(item, str) for item in retry_on):
        add("retryOn", f"retryOn must be a list of: {', '.join(RetryOn.ALL)}.")
        retry_on = list(RetryOn.ALL)
    else:
        bad = [item[:40] for item in retry_on if item not in RetryOn.ALL]
        if bad:
            add("retryOn", f"Unknown values {', '.join(repr(b) for b in bad)}; valid: {', '.join(RetryOn.ALL)}.")
    retry_interrupted = raw.get("retryInterrupted", False)
    if not isinstance(retry_interrupted, bool):
        add("retryInterrupted", "retryInterrupted must be true or false.")
        retry_interrupted = False
    if errors:
        return None, errors
    ordered = tuple(item for item in RetryOn.ALL if item in retry_on)
    return (
        RetryPolicy(
            max_attempts=max_attempts,
            min_backoff_ms=min_backoff,
            max_backoff_ms=max_backoff,
            retry_on=ordered,
            retry_interrupted=retry_interrupted,
            min_backoff_given="minBackoffMs" in raw,
        ),
        {},
    )


def policy_ceiling_errors(policy: RetryPolicy, *, max_attempts: int, min_backoff_ms: int) -> dict[str, list[str]]:
    """What of `policy` goes past the operator's ceilings for its tenant: more attempts than
    `max_attempts`, or less than `min_backoff_ms` between them (docs/retries.md, "Operator
    ceilings")."""
    errors: dict[str, list[str]] = {}
    if policy.max_attempts > max_attempts:
        errors["retryPolicy.maxAttempts"] = [
            f"At most {max_attempts} for this tenant (the operator's ceiling on a call's attempts)."
        ]
    if policy.max_attempts > 1 and policy.min_backoff_ms < min_backoff_ms:
        errors["retryPolicy.minBackoffMs"] = [
            f"At least {min_backoff_ms} for this tenant (the operator's floor on the time between attempts)."
        ]
    return errors


def policy_capped(policy: RetryPolicy, *, max_attempts: int, min_backoff_ms: int) -> RetryPolicy:
    """`policy` brought within the ceilings: fewer attempts, longer backoffs."""
    floor = min_backoff_ms if policy.max_attempts > 1 else policy.min_backoff_ms
    return replace(
        policy,
        max_attempts=min(policy.max_attempts, max_attempts),
        min_backoff_ms=max(policy.min_backoff_ms, floor),
        max_backoff_ms=max(policy.max_backoff_ms, floor),
    )


def retry_class(outcome: Outcome) -> str | None:
    """The `retryOn` value a failure falls under, or None for one never retried (EgressDenied,
    TlsError, a 4xx other than 429, InternalError: trying again cannot change them)."""
    kind = outcome.error_kind
    if kind == ErrorKind.HTTP_ERROR and outcome.status is not None:
        if outcome.status == 429:
            return RetryOn.HTTP_429
        if 500 <= outcome.status <= 599:
            return RetryOn.HTTP_5XX
        return None
    if kind == ErrorKind.TIMEOUT:
        return RetryOn.TIMEOUT
    if kind == ErrorKind.NETWORK_ERROR:
        return RetryOn.NETWORK_ERROR
    if kind == ErrorKind.CREDENTIAL_ERROR:
        return RetryOn.CREDENTIAL_ERROR
    return None


def should_retry(policy: RetryPolicy, outcome: Outcome, *, attempt: int) -> bool:
    """Whether attempt number `attempt` (1-based), which ended with `outcome`, is followed by
    another. `Interrupted` (the request may have been sent) only with `retryInterrupted`."""
    if outcome.succeeded or attempt >= policy.max_attempts:
        return False
    if outcome.error_kind == ErrorKind.INTERRUPTED:
        return policy.retry_interrupted
    return retry_class(outcome) in policy.retry_on


def retry_after_ms(outcome: Outcome, *, now: datetime) -> int | None:
    """The target's `Retry-After` (delay-seconds or an HTTP-date), in milliseconds, or None."""
    value = next((v for k, v in (outcome.headers or {}).items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        return min(int(value), BACKOFF_CEILING_MS // 1000) * 1000
    if len(value) > 64:  # no HTTP-date is that long
        return None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return max(0, min(int((when - now).total_seconds() * 1000), BACKOFF_CEILING_MS))
    except OverflowError:
        return None


def backoff_ms(
    policy: RetryPolicy, outcome: Outcome, *, attempt: int, now: datetime, rng: random.Random | None = None
) -> int:
    """The delay before the attempt after `attempt`: min × 2^(attempt-1), ±10 % jitter, within
    [minBackoffMs, maxBackoffMs]; a `Retry-After` replaces it, within the same bounds."""
    low, high = policy.min_backoff_ms, policy.max_backoff_ms
    asked = retry_after_ms(outcome, now=now)
    if asked is not None:
        return max(low, min(high, asked))
    base = min(high, low * 2 ** min(attempt - 1, 40))
    jittered = base * (1 + (rng or random).uniform(-JITTER, JITTER))
    return int(max(low, min(high, jittered)))


def next_attempt_at(policy: RetryPolicy, outcome: Outcome, *, attempt: int, now: datetime) -> datetime:
    return now + timedelta(milliseconds=backoff_ms(policy, outcome, attempt=attempt, now=now))
