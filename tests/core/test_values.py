"""The wire format of times (core.ids.iso_ms), and values prepared for the database the way the
ORM prepares them (core.db.saver, the hot paths' INSERTs and UPDATEs)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import F, IntegerChoices, UUIDField
from django.utils.translation import gettext_lazy

from core.db import db_param, insert_prepare, rows_by_key, saver
from core.ids import iso_ms
from delivery.models import Notification
from orchestration.models import ServiceCall, ServiceCallTag
from outbox.models import OutboxEvent
from tenants.models import ApiKey
from tests.support.factories import make_call


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05.000Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 999_999, tzinfo=UTC), "2026-01-02T03:04:05.999Z"),
        (
            datetime(2026, 1, 2, 3, 4, 5, 1_500, tzinfo=timezone(timedelta(hours=5, minutes=30))),
            "2026-01-01T21:34:05.001Z",
        ),
        (datetime(1, 1, 1, tzinfo=UTC), "0001-01-01T00:00:00.000Z"),
        (None, None),
    ],
)
def test_times_go_out_in_utc_with_milliseconds_and_z(value, wire):
    assert iso_ms(value) == wire


class _Sub(str):
    """A str subclass, as a TextChoices member is."""


class _Level(IntegerChoices):
    LOW = 1


VALUES = [
    None,
    "",
    "text",
    _Sub("sub"),
    gettext_lazy("lazy"),
    _Level.LOW,
    F("name"),
    datetime(2026, 1, 2, 3, 4, 5),  # naive: the ORM warns and makes it aware
    ServiceCall.Status.SCHEDULED,
    0,
    7,
    True,
    False,
    1.5,
    uuid.UUID("01890a5d-ac96-774b-bcce-b302099a8057"),
    "01890a5d-ac96-774b-bcce-b302099a8057",
    datetime(2026, 1, 2, 3, 4, 5, 6_000, tzinfo=UTC),
    datetime(2026, 1, 2, 3, 4, 5, 6_000, tzinfo=timezone(timedelta(hours=-3))),
    {"a": [1, 2]},
]


@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime")
@pytest.mark.django_db
@pytest.mark.also_postgres
@pytest.mark.parametrize("model", [ServiceCall, ServiceCallTag, OutboxEvent, Notification, ApiKey])
def test_every_field_prepares_every_value_as_the_orm_does(model):
    conn = connections[DEFAULT_DB_ALIAS]
    for field in model._meta.concrete_fields:
        prepare = saver(field, conn)
        for value in VALUES:
            try:
                expected = field.get_db_prep_save(value, conn)
            except (TypeError, ValueError, AttributeError, LookupError, ValidationError) as exc:
                with pytest.raises(type(exc)):
                    prepare(value, conn)
                continue
            got = prepare(value, conn)
            assert _comparable(got) == _comparable(expected), (field, value)


def _comparable(value):
    # psycopg's Jsonb wrapper (a JSON value on PostgreSQL) does not compare by what it holds.
    return type(value), getattr(value, "obj", value)


@pytest.mark.django_db
@pytest.mark.also_postgres
def test_an_insert_sets_what_pre_save_sets_auto_now_add_included():
    from tests.support.factories import make_tenant

    make_tenant("acme")
    key = ApiKey(tenant_id="acme", label="l", prefix="p", key_hash="h" * 64)
    assert key.created_at is None
    insert_prepare([key]).run()
    assert key.created_at is not None  # auto_now_add: pre_save set it, as save() would
    assert ApiKey.objects.get(key_hash="h" * 64).created_at == key.created_at


@pytest.mark.django_db
@pytest.mark.also_postgres
@pytest.mark.parametrize("fields", [None, ("tenant", "request_spec", "due_at", "attempts", "held_since")])
def test_rows_by_key_makes_the_instances_the_orm_makes(world, fields):
    """core.db.rows_by_key reads its rows by a statement built once and turns them into
    instances itself: every loaded value (JSON, aware datetimes, UUIDs, nulls) and the deferred
    fields must be the ORM's."""
    calls = [
        make_call("acme", name="one", headers={"X-A": "1"}, body={"n": [1, 2]}, tags=["a"], due_in=60),
        make_call("globex", name="two", method="POST", body="text", due_in=0),
    ]
    keys = [call.pk for call in calls]
    ours = {row.pk: row for row in rows_by_key(ServiceCall, keys=keys, fields=fields)}
    orm = ServiceCall.objects.filter(pk__in=keys)
    for expected in orm.only(*fields) if fields else orm:
        row = ours.pop(expected.pk)
        assert row.get_deferred_fields() == expected.get_deferred_fields()
        loaded = [
            f.attname for f in ServiceCall._meta.concrete_fields if f.attname not in expected.get_deferred_fields()
        ]
        assert {name: getattr(row, name) for name in loaded} == {name: getattr(expected, name) for name in loaded}
        assert (row._state.adding, row._state.db) == (False, expected._state.db)
    assert ours == {}


@pytest.mark.django_db
@pytest.mark.also_postgres
def test_a_datetime_or_uuid_a_statement_passes_is_what_the_orm_passes():
    """core.db's statements (sql_query, sql_execute_many) adapt their datetimes themselves: each
    must be what the backend's own adaptation makes of it, whatever its zone."""
    conn = connections[DEFAULT_DB_ALIAS]
    values = [
        datetime(2026, 11, 27, 8, 0, tzinfo=UTC),
        datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-8))),
        datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=14))),
    ]
    assert [db_param(value) for value in values] == [conn.ops.adapt_datetimefield_value(v) for v in values]
    key = uuid.uuid4()
    assert db_param(key) == UUIDField().get_db_prep_value(key, conn)
    assert db_param("text") == "text" and db_param(3) == 3


@pytest.mark.also_postgres
@pytest.mark.django_db
def test_insert_many_gives_the_fields_a_row_leaves_out_the_models_defaults():
    """A field left out takes what the ORM's create gives it: a constant default, a callable
    default called for each row (a list of its own), and for a field without a default its
    None, or "" where the field keeps text."""
    from core.db import insert_many
    from core.ids import new_id, utcnow
    from delivery.models import Subscription

    now = utcnow()
    given = {"tenant": None, "kind": "nats", "created_at": now, "updated_at": now}
    made = [new_id(), new_id()]
    assert insert_many(Subscription, rows=[{"subscription_id": key, "name": "many", **given} for key in made]) == 2
    orm = Subscription.objects.create(subscription_id=new_id(), name="orm", **given)
    left_out = [
        field.attname
        for field in Subscription._meta.concrete_fields
        if field.name not in {"subscription_id", "name", *given}
    ]
    assert {"event_types", "enabled", "url", "secret", "failing_since", "disabled_reason"} <= set(left_out)
    rows = {row.pop("subscription_id"): row for row in Subscription.objects.values("subscription_id", *left_out)}
    assert rows[made[0]] == rows[made[1]] == rows[orm.pk]
    assert rows[orm.pk]["event_types"] == [] and rows[orm.pk]["secret"] is None and rows[orm.pk]["url"] == ""
