"""Helpers shared by the management commands (not a command: Django skips `_` modules)."""

from __future__ import annotations

from django.core.management.base import CommandError

from core.errors import ApplicationError, ValidationFailed


def command_error(exc: ApplicationError, *, options: dict[str, str] | None = None) -> CommandError:
    """A CommandError listing every field error, named by the command's option where one fits."""
    if isinstance(exc, ValidationFailed) and exc.errors:
        lines = ["Invalid input:"]
        for field, messages in exc.errors.items():
            label = (options or {}).get(field, field)
            lines.extend(f"  {label}: {message}" for message in messages)
        return CommandError("\n".join(lines))
    return CommandError(exc.detail)
