"""Identifiers and wire-format times shared by every module."""

from __future__ import annotations

import secrets
import uuid
from datetime import UTC, datetime

import uuid6


def new_id() -> uuid.UUID:
    """A UUID v7: time-ordered, so newest-first order is id order."""
    return uuid.UUID(bytes=uuid6.uuid7().bytes)


def new_id_dated_as(other: uuid.UUID) -> uuid.UUID:
    """A new UUID v7 bearing the time of `other` (a UUID v7), random otherwise: a row made for
    another row (a notification for its event) is dated as that row, and so falls in the same
    day's partition of a table partitioned by its id (docs/schema.md, "History partitioned by
    day")."""
    random = secrets.randbits(74)
    # 48 bits of time, version 7, 12 random bits, variant 0b10, 62 random bits (RFC 9562).
    return uuid.UUID(int=(other.int >> 80) << 80 | 0x7 << 76 | (random >> 62) << 64 | 0b10 << 62 | random & (2**62 - 1))


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso_ms(value: datetime | None) -> str | None:
    """ISO 8601 UTC with milliseconds and Z, the wire format of every time."""
    if value is None:
        return None
    # isoformat ends in "+00:00" in UTC; it costs a third of strftime's time.
    return value.astimezone(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def epoch_ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def short_id(value: object) -> str:
    """The last 8 hex digits of an id. (A UUID v7 starts with its timestamp, so the first
    digits are the same for every call made within a minute.)"""
    return str(value).replace("-", "")[-8:]
