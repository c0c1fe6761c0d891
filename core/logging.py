"""Structured logs, one line per record: JSON for collectors, or text for a person at a terminal.

Both carry tenantId, serviceCallId and correlationId wherever they are known (`log_context`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import time
from collections.abc import Iterator

_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("log_context", default=None)


@contextlib.contextmanager
def log_context(**values: str | None) -> Iterator[None]:
    """Bind fields (tenantId=..., serviceCallId=..., correlationId=...) to log lines within."""
    merged = {**(_context.get() or {}), **{k: str(v) for k, v in values.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, str]:
    return dict(_context.get() or {})


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


# The context first, in this order, then the record's other fields.
_CONTEXT_KEYS = ("tenantId", "serviceCallId", "correlationId")
# Anything but printable ASCII is escaped, so no value (a call's name, a target's error text)
# can break a line in two, forge another, or send terminal control sequences.
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")
_NEEDS_QUOTES = re.compile(r'[\s="]')


def _printable(text: str) -> str:
    return _UNPRINTABLE.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def _text_value(value: object) -> str:
    text = str(value)
    if text and not _NEEDS_QUOTES.search(text) and not _UNPRINTABLE.search(text):
        return text
    return json.dumps(text)  # quoted, everything unprintable escaped


def _message(text: str) -> str:
    """The message as is, unless it could pass for fields of its own (`a=b`): then quoted."""
    return _printable(text) if "=" not in text and '"' not in text else json.dumps(text)


class TextFormatter(logging.Formatter):
    """`2026-01-02 10:00:00 INFO logger message key=value ...`: short lines for a terminal.

    Fields that are not simple values (an event's whole payload) are left to the JSON format.
    """

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            key: value
            for key, value in vars(record).items()
            if key not in _STANDARD and not key.startswith("_") and isinstance(value, str | int | float | bool)
        }
        ordered = [key for key in _CONTEXT_KEYS if key in fields] + [key for key in fields if key not in _CONTEXT_KEYS]
        parts = [
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.created)),
            record.levelname,
            record.name,
            _message(record.getMessage()),
            *(f"{key}={_text_value(fields[key])}" for key in ordered),
        ]
        line = " ".join(parts)
        if record.exc_info:
            # Indented, so a traceback's lines cannot pass for records of their own.
            line += "".join(f"\n    {_printable(text)}" for text in self.formatException(record.exc_info).splitlines())
        return line
