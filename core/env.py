"""Strict environment helpers: a typo in a variable fails loudly at start-up."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


class SettingsError(ImproperlyConfigured):
    """A setting the environment got wrong: manage.py and wsgi.py print it as one line and stop."""


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    raise SettingsError(f"{name} must be 'true' or 'false', got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
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
