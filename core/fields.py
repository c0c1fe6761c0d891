"""Model fields shared by the apps."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import models

T = TypeVar("T")


def on_fresh_stack(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)`, and should it raise RecursionError, again on a fresh thread's
    stack: Python's JSON encoder and decoder recurse once per level against one limit shared
    with the caller's frames, so a value nested near that limit fails from a deep stack alone."""
    try:
        return function(*args, **kwargs)
    except RecursionError:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="deep-json") as pool:
            return pool.submit(function, *args, **kwargs).result()


class JSONField(models.JSONField):
    """Django's JSONField, whose stored values decode however deep the caller's stack is.

    Python's JSON decoder recurses once per level, against one limit shared with the frames
    already on the stack: a value nested ~900 levels deep (what the API stored before the limit
    of docs/security.md §1) decodes in a shallow view and raises RecursionError in a deep one,
    making every page that reads the row a 500. Recursion is counted per thread, so the rare
    value that fails here is decoded again on a fresh thread's stack.

    Migrations see a plain JSONField: the column and what is written are the same.
    """

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return on_fresh_stack(super().from_db_value, value, expression, connection)

    def deconstruct(self) -> tuple[str, str, list[Any], dict[str, Any]]:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs
