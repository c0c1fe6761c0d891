"""Operator ceilings, the pure rules (docs/flow-control.md, "Operator ceilings"): what each
ceiling limits, its bounds, its default setting, and the check of a change. No database here:
tenants.selectors reads a tenant's ceilings, tenants.services sets them.

A ceiling caps what a tenant can do to the others through the shared engine: calls Running
at once and started per second (a tenant's own flow-control limits may only be lower),
subscriptions, test pings a minute, submissions a second per API key, and a call's retries
(at most `maxAttempts` attempts, at least `minBackoffMs` between them). Each tenant has the
defaults of the environment unless the operator set its own value (admin, or manage.py
set_tenant_ceilings); the tenant itself never sets them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.errors import ValidationFailed


@dataclass(frozen=True)
class Bound:
    """One ceiling: its wire name, its column in tenant_ceilings, the setting that gives its
    default, its bounds, and what it means."""

    name: str
    column: str
    setting: str
    minimum: int | float
    maximum: int | float
    integer: bool
    meaning: str
    # Whether the default may be "no ceiling" (an empty setting): only where the engine keeps
    # tenants apart anyway (calls over a limit wait, and execution slots are shared fairly).
    optional: bool = False
    # A floor (the tenant's value may not be lower) rather than a ceiling.
    floor: bool = False

    def describe(self, value: int | float | None) -> str:
        return "none" if value is None else number_text(value)

    @property
    def range_text(self) -> str:
        return f"{number_text(self.minimum)} to {number_text(self.maximum)}"


def number_text(value: int | float) -> str:
    """86400000 as such, 0.001 as such (not 8.64e+07)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


BOUNDS: tuple[Bound, ...] = (
    Bound(
        "parallelism",
        "call_parallelism",
        "CEILING_CALL_PARALLELISM",
        1,
        1000,
        True,
        "calls Running at once",
        optional=True,
    ),
    Bound(
        "ratePerSecond",
        "call_rate_per_second",
        "CEILING_CALL_RATE_PER_SECOND",
        0.001,
        1000.0,
        False,
        "call starts per second",
        optional=True,
    ),
    Bound(
        "subscriptions",
        "subscriptions",
        "MAX_SUBSCRIPTIONS_PER_TENANT",
        1,
        10_000,
        True,
        "subscriptions (operator-wide ones are not counted)",
    ),
    Bound(
        "testPingsPerMinute",
        "test_pings_per_minute",
        "CEILING_TEST_PINGS_PER_MINUTE",
        1,
        10_000,
        True,
        "test pings a minute (POST .../subscriptions/{id}/test)",
    ),
    Bound(
        "submissionsPerSecond",
        "submissions_per_second",
        "CEILING_SUBMISSIONS_PER_SECOND",
        1,
        100_000,
        True,
        "submissions a second per API key (POST .../service-calls and .../rerun)",
    ),
    Bound(
        "maxAttempts",
        "max_attempts",
        "CEILING_MAX_ATTEMPTS",
        1,
        20,
        True,
        "attempts of one call, its retries included (retryPolicy.maxAttempts)",
    ),
    Bound(
        "minBackoffMs",
        "min_backoff_ms",
        "CEILING_MIN_BACKOFF_MS",
        100,
        24 * 3600 * 1000,
        True,
        "milliseconds between a call's attempts, at least (retryPolicy.minBackoffMs)",
        floor=True,
    ),
)
BY_NAME = {bound.name: bound for bound in BOUNDS}
BY_COLUMN = {bound.column: bound for bound in BOUNDS}


@dataclass(frozen=True)
class Ceilings:
    """A tenant's ceilings in force: its own where the operator set one, else the default
    (None: no ceiling, only for parallelism and ratePerSecond)."""

    parallelism: int | None
    rate_per_second: float | None
    subscriptions: int
    test_pings_per_minute: int
    submissions_per_second: int
    max_attempts: int
    min_backoff_ms: int

    @property
    def limits_calls(self) -> bool:
        return self.parallelism is not None or self.rate_per_second is not None

    def as_wire(self) -> dict[str, Any]:
        return {bound.name: getattr(self, bound.column.removeprefix("call_")) for bound in BOUNDS}


def ceilings_resolve(*, stored: dict[str, Any], defaults: dict[str, Any]) -> Ceilings:
    """The ceilings in force from a tenant's stored columns (None: the default) and the defaults
    (settings, by setting name)."""
    values = {}
    for bound in BOUNDS:
        own = stored.get(bound.column)
        values[bound.column.removeprefix("call_")] = own if own is not None else defaults.get(bound.setting)
    return Ceilings(**values)


def _value_error(bound: Bound, value: Any) -> str | None:
    kind = "a whole number" if bound.integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float) or (bound.integer and not isinstance(value, int)):
        return f"Must be {kind} from {bound.range_text}, or null for the default."
    if not bound.minimum <= value <= bound.maximum:  # NaN and infinities fail this too
        return f"Must be from {bound.range_text} (or null for the default)."
    return None


def validate_ceilings(data: Any) -> dict[str, int | float | None]:
    """A change `{name: value or null}` (wire names; null: back to the default) as
    {column: value}; ValidationFailed naming every bad field, and nothing is kept."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["Expected an object {name: value or null}."]})
    errors: dict[str, list[str]] = {}
    changes: dict[str, int | float | None] = {}
    for name, value in data.items():
        bound = BY_NAME.get(name)
        if bound is None:
            shown = str(name)[:60] if str(name).isprintable() else "body"
            errors.setdefault(shown, []).append(f"Unknown ceiling; known: {', '.join(BY_NAME)}.")
            continue
        if value is not None and (problem := _value_error(bound, value)) is not None:
            errors.setdefault(name, []).append(problem)
            continue
        changes[bound.column] = float(value) if value is not None and not bound.integer else value
    if errors:
        raise ValidationFailed(errors)
    return changes


def over_ceiling(name: str, value: int | float | None, ceiling: int | float | None) -> str | None:
    """Why a tenant's own `value` for `name` goes past the operator's `ceiling`, or None.
    A floor (minBackoffMs) is passed below it."""
    bound = BY_NAME[name]
    if ceiling is None:
        return None
    if bound.floor:
        if value is not None and value < ceiling:
            return f"At least {number_text(ceiling)} for this tenant (the operator's floor, {bound.meaning})."
        return None
    if value is not None and value > ceiling:
        return f"At most {number_text(ceiling)} for this tenant (the operator's ceiling: {bound.meaning})."
    return None
