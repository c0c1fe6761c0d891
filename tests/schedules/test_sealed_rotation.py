"""schedule_sealed_values_rotate: a schedule's secret header values, sealed at rest as a call's,
re-encrypted under the first FIELD_ENCRYPTION_KEYS key, so the old key can be dropped and the
calls the schedule makes later still send them."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet, InvalidToken

from core.secrets import SEALED, unseal_headers
from schedules.models import Schedule
from schedules.services import schedule_sealed_values_rotate
from tests.support.schedules import make_schedule

pytestmark = pytest.mark.django_db

OLD = Fernet.generate_key().decode()
NEW = Fernet.generate_key().decode()


def test_it_re_encrypts_every_sealed_value_under_the_first_key(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    sealed = make_schedule(name="s", headers={"Authorization": "Bearer sch-111", "X-Plain": "p"})
    plain = make_schedule(name="p", headers={"Accept": "text/plain"})
    settings.FIELD_ENCRYPTION_KEYS = [NEW, OLD]

    result = schedule_sealed_values_rotate()

    assert (result.examined, result.rotated, result.failed) == (2, 1, [])
    token = Schedule.objects.get(pk=sealed.pk).request_spec["headers"]["Authorization"][SEALED].encode()
    assert Fernet(NEW.encode()).decrypt(token) == b"Bearer sch-111"
    with pytest.raises(InvalidToken):
        Fernet(OLD.encode()).decrypt(token)
    settings.FIELD_ENCRYPTION_KEYS = [NEW]
    assert unseal_headers(Schedule.objects.get(pk=sealed.pk).request_spec["headers"]) == {
        "Authorization": "Bearer sch-111",
        "X-Plain": "p",
    }
    assert Schedule.objects.get(pk=plain.pk).request_spec["headers"] == {"Accept": "text/plain"}


def test_a_value_no_configured_key_opens_is_reported_and_left(world, settings):
    settings.FIELD_ENCRYPTION_KEYS = [OLD]
    schedule = make_schedule(headers={"X-Api-Key": "k"})
    before = Schedule.objects.get(pk=schedule.pk).request_spec
    settings.FIELD_ENCRYPTION_KEYS = [NEW]

    result = schedule_sealed_values_rotate()

    assert result.failed == [str(schedule.pk)]
    assert Schedule.objects.get(pk=schedule.pk).request_spec == before
