"""Strict environment helpers: a typo in a variable fails loudly at start-up."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured


class SettingsError(ImproperlyConfigured):
    """A setting the environment got wrong: manage.py and wsgi.py print it as one line and stop."""


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


# What people type for a switch, whatever the case; anything else is refused, never guessed.
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name} must be true or false (or 1/0, yes/no, on/off), got {raw!r}")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (compared case-insensitively, returned as spelled in `choices`)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    for choice in choices:
        if raw.strip().lower() == choice.lower():
            return choice
    raise SettingsError(f"{name} must be one of {', '.join(choices)}; got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(ascii_digits(raw))
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise SettingsError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name} must be <= {maximum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_pair(name: str) -> tuple[str, str] | None:
    """`a,b` as a pair; unset or empty is None, anything but two non-empty items is refused."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    items = [item.strip() for item in raw.split(",")]
    if len(items) != 2 or not all(items):
        raise SettingsError(f"{name} must be two comma-separated values, got {raw!r}")
    return items[0], items[1]


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in `text`: a number with a unit (`500ms`, `5s`, `5m`, `2h`, `3d`) or plain
    seconds. Raises ValueError."""
    text = text.strip().lower()
    for unit in ("ms", "s", "m", "h", "d"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * _UNITS[unit]
    if text.replace(".", "", 1).isdigit():
        return float(text)
    raise ValueError(f"{text!r} is not a duration (e.g. 30s, 5m, 2h, 3d)")


def env_duration(name: str, default: str) -> float:
    """A duration in seconds from `name` (see parse_duration)."""
    raw = os.environ.get(name) or default
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None


def env_durations(name: str, default: str) -> list[float]:
    """A comma-separated list of durations in seconds (at least one)."""
    raw = os.environ.get(name) or default
    try:
        values = [parse_duration(item) for item in raw.split(",") if item.strip()]
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None
    if not values:
        raise SettingsError(f"{name} must list at least one duration")
    return values


def env_ceiling(
    name: str, default: float | None, *, minimum: float, maximum: float, integer: bool = True
) -> int | float | None:
    """An operator's ceiling (docs/flow-control.md, "Operator ceilings"): a number from `minimum`
    to `maximum`. Unset is `default`; empty or `none` is no ceiling, allowed only where
    `default` is None (a ceiling that protects a fresh install cannot be switched off by a
    blank line)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("", "none"):
        if default is not None:
            raise SettingsError(f"{name} must be a number from {minimum:g} to {maximum:g}; it cannot be turned off")
        return None
    bounds = f"{_shown(minimum)} to {_shown(maximum)}"
    try:
        value: int | float = int(ascii_digits(text)) if integer else float(ascii_digits(text))
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise SettingsError(f"{name} must be {kind} from {bounds}, got {raw!r}") from None
    if not minimum <= value <= maximum:  # NaN fails this too
        raise SettingsError(f"{name} must be from {bounds}, got {raw!r}")
    return value


def ascii_digits(text: str) -> str:
    """`text`, if it is written in ASCII: Python's int() and float() also read other scripts'
    digits ('٣', '１０') and underscores, which no operator means in a setting."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return text


def _shown(number: float) -> str:
    """86400000, not 8.64e+07."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def served_base_url(path: Path) -> str:
    """The URL scripts/start serves a data directory at, as it recorded it in `path` (docs/commands.md):
    the default of AGENT_BASE_URL for the commands of another shell. Only a loopback http(s)
    URL counts (the file is no place to widen the egress policy from); "" when there is none, it
    cannot be read, or it names anything else."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or parts.username or parts.password or parts.query or parts.fragment:
        return ""
    try:
        loopback = ipaddress.ip_address(parts.hostname or "").is_loopback
    except ValueError:
        loopback = parts.hostname == "localhost"
    return text if loopback else ""
