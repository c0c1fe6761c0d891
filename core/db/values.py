"""A field's value made ready for the database as the ORM makes it, cheaper for the values the
hot paths write (saver).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db.models import (
    BigIntegerField,
    BooleanField,
    CharField,
    DateTimeField,
    Field,
    ForeignKey,
    IntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
    SmallIntegerField,
    TextField,
    UUIDField,
)
from django.db.models.fields import AutoFieldMixin

# A field's value made ready for the database as `field.get_db_prep_save(value, conn)` makes it,
# cheaper for the values the hot paths write (str, int, bool, an aware datetime, a UUID), by
# field and vendor: the ORM's chain (get_db_prep_save, get_db_prep_value, get_prep_value,
# to_python, each looking up the connection's features and operations) cost more than the
# INSERT of a submission's rows. Any other value, or any other kind of field, takes the
# field's own method.
Saver = Callable[[Any, Any], Any]
_SAVERS: dict[tuple[int, str], Saver] = {}  # by id(field): a field lives as long as its model
_INTEGER_FIELDS = (
    IntegerField,
    BigIntegerField,
    SmallIntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
)


def saver(field: Field, conn: Any) -> Saver:
    """`(value, conn) -> database value` for `field` on `conn`'s database: `field.get_db_prep_save`."""
    key = (id(field), conn.vendor)
    found = _SAVERS.get(key)
    if found is None:
        found = _SAVERS.setdefault(key, _make_saver(field, conn))
    return found


def _make_saver(field: Field, conn: Any) -> Saver:
    slow = field.get_db_prep_save
    kind = type(field)
    if kind is ForeignKey:
        target = saver(field.target_field, conn)
        return lambda value, conn: (
            target(value, conn) if isinstance(value, (str, uuid.UUID)) and value != "" else slow(value, conn)
        )
    if kind in (CharField, TextField):
        # to_python: a str (a TextChoices member too) is kept as it is.
        return lambda value, conn: value if value is None or isinstance(value, str) else slow(value, conn)
    if kind in _INTEGER_FIELDS:
        internal = field.get_internal_type()
        # The vendor's adaptation (PostgreSQL's sized integer types) of an int kept as it is.
        return lambda value, conn: (
            conn.ops.adapt_integerfield_value(value, internal)
            if value is None or type(value) is int
            else slow(value, conn)
        )
    if kind is BooleanField:
        return lambda value, conn: value if value is None or type(value) is bool else slow(value, conn)
    if isinstance(field, AutoFieldMixin):
        # A key the database made (the outbox's, the attempt log's): an int kept as it is, as
        # AutoFieldMixin.get_db_prep_value keeps it, then checked by the vendor.
        return lambda value, conn: conn.ops.validate_autopk_value(value) if type(value) is int else slow(value, conn)
    if kind is UUIDField:
        if conn.features.has_native_uuid_field:
            return lambda value, conn: value if value is None or type(value) is uuid.UUID else slow(value, conn)
        return lambda value, conn: (
            value.hex if type(value) is uuid.UUID else None if value is None else slow(value, conn)
        )
    if kind is DateTimeField:
        # An aware datetime needs no warning nor conversion first: the vendor's adaptation only.
        return lambda value, conn: (
            conn.ops.adapt_datetimefield_value(value)
            if type(value) is datetime and value.tzinfo is not None
            else None
            if value is None
            else slow(value, conn)
        )
    return slow
